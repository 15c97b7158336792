#!/usr/bin/env bash
# Installs vLLM's router (`vllm-router` on PyPI: a Rust binary in a wheel) into its own venv
# (.venv-router), for the replicas test (tests/integration/test_replicas.py) and benchmark
# (benchmarks/performance/replicas.py), which start `.venv-router/bin/vllm-router` in front of two vLLM
# replicas. Its own venv: the wheel's Python side must not touch vLLM's pins. The version is the one the
# test was written against (its policies' names and flags are part of what the test measures).
# Idempotent: does nothing when that version is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ROUTER_VENV:-.venv-router}
VERSION=${VLLM_ROUTER_VERSION:-0.1.17}
PYTHON=${PYTHON:-python3}
if [ -x "$VENV/bin/vllm-router" ] && "$VENV/bin/python" - "$VERSION" <<'PY'
import importlib.metadata, sys
sys.exit(importlib.metadata.version("vllm-router") != sys.argv[1])
PY
then
  echo "vllm-router $VERSION already installed in $VENV"; exit 0
fi
# The machine's pip config may point at a local package index meant for the vLLM venv.
[ -x "$VENV/bin/python" ] || PIP_CONFIG_FILE=/dev/null "$PYTHON" -m venv "$VENV"
PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install -q "vllm-router==$VERSION"
"$VENV/bin/python" -c "import importlib.metadata as m; print('installed: vllm-router', m.version('vllm-router'))"
