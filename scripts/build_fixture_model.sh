#!/usr/bin/env bash
# Builds the repo's tiny Qwen2.5-VL fixture model (tinyvlm/) into var/models/fixture-vlm, unless the
# build there carries the digest of the current spec, prompts and training code. No downloads: the
# tokenizer, config and weights come from code; training takes a few minutes on 2 CPU cores.
# Usage: scripts/build_fixture_model.sh [OUT_DIR]      (PYTHON=... to use another interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-var/models/fixture-vlm}
mkdir -p "$(dirname "$OUT")"
exec "$PY" -m faithproxy.tinyvlm.train_fixture --out "$OUT" --if-stale
