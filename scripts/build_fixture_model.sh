#!/usr/bin/env bash
# Builds the repo's tiny Qwen2.5-VL models (benchmarks/tinyvlm/), unless a build carries the digest of the current
# spec, prompts and training code: the fixture model into var/models/fixture-vlm, and the reasoning-format
# models (one set of weights, one directory per family's chat template: Qwen3-VL-Thinking, GLM-4.1V-Thinking,
# Qwen2.5-VL) into var/models/formats. No downloads: the tokenizer, config and weights come from code;
# training takes a few minutes each on 2 CPU cores.
# Usage: scripts/build_fixture_model.sh [OUT_DIR [FORMATS_DIR]]      (PYTHON=... to use another interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-var/models/fixture-vlm}
FORMATS=${2:-var/models/formats}
mkdir -p "$(dirname "$OUT")" "$(dirname "$FORMATS")"
"$PY" -m faithproxy.benchmarks.tinyvlm.train_fixture --out "$OUT" --if-stale
exec "$PY" -m faithproxy.benchmarks.tinyvlm.train_formats --out "$FORMATS" --if-stale
