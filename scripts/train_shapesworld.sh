#!/usr/bin/env bash
# Trains the ShapesWorld model from scratch on CPU (seeded; see benchmarks/shapesworld/model/train.py) into
# var/sw-train, at the lowest CPU priority so that it only takes idle cores, and appends its output to
# var/sw-train/train.log (so a --resume continues the same log). The chosen checkpoint ends up in
# var/sw-train/final; --install then copies it to benchmarks/shapesworld/model/weights/ (the committed weights).
# Continue a run: scripts/train_shapesworld.sh --install --minutes 90 --resume var/sw-train/checkpoints/step-NNNNNN
# Usage: scripts/train_shapesworld.sh [--install] [train.py options, e.g. --minutes 70 --seed 0]
#        (PYTHON=... for another interpreter, OUT=... for another run folder)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-var/sw-train}
INSTALL=0
if [[ "${1:-}" == "--install" ]]; then INSTALL=1; shift; fi
mkdir -p "$OUT"
nice -n 19 "$PY" -m faithproxy.benchmarks.shapesworld.model.train --out "$OUT" "$@" 2>&1 | tee -a "$OUT/train.log"
if [[ $INSTALL == 1 ]]; then
    rm -rf benchmarks/shapesworld/model/weights
    cp -r "$OUT/final" benchmarks/shapesworld/model/weights
    du -sh benchmarks/shapesworld/model/weights
fi
