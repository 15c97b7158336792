#!/usr/bin/env bash
# One round of the ShapesWorld loop where a GPU is (the device machine: python3 with torch and
# transformers, the repo's tree as the working directory, $OUT for what comes back). Trains each DPO
# candidate and its SFT twin on the exported pairs, then writes every model's greedy chains on the
# selection seed (999) and on the frozen held-out seed, one file per model, so that only the models
# the selection rule picks are ever read on the held-out seed.
#   bash benchmarks/evaluation/flywheel_device_round.sh PAIRS LR...      (N=300 chains per seed, DEVICE=cuda unless set)
set -euo pipefail
PAIRS=$1; shift
N=${N:-300}
HELDOUT_ARGS=()  # the frozen held-out seed unless SMOKE_SEED names another (a smoke test never reads it)
[[ -n ${SMOKE_SEED:-} ]] && HELDOUT_ARGS=(--seed "$SMOKE_SEED")
DEVICE=${DEVICE:-cuda}
ROOT=$PWD
mkdir -p /tmp/fp/faithproxy /tmp/models
for f in faithproxy/*; do ln -sfn "$ROOT/$f" /tmp/fp/faithproxy/; done
for d in faithcore clients detectors regenerators server benchmarks flywheel; do
  ln -sfn "$ROOT/$d" "/tmp/fp/faithproxy/$d"
done
export PYTHONPATH=/tmp/fp PYTHONUNBUFFERED=1
cd /tmp
MODELS=(--model "base=$ROOT/benchmarks/shapesworld/model/weights")
for lr in "$@"; do
  for objective in dpo sft; do
    python3 -m faithproxy.flywheel.train_cli "$objective" --pairs "$ROOT/$PAIRS" --model "$ROOT/benchmarks/shapesworld/model/weights" \
      --out "/tmp/models/$objective-$lr" --lr "$lr" --epochs 4 --batch-size 8 --device "$DEVICE" --log-every 5 \
      > "$OUT/train-$objective-$lr.log" 2>&1
    cp "/tmp/models/$objective-$lr/summary.json" "$OUT/train-$objective-$lr.json"
    MODELS+=(--model "$objective-$lr=/tmp/models/$objective-$lr/model")
  done
done
python3 -m faithproxy.benchmarks.evaluation.flywheel_loop generate "${MODELS[@]}" --seed 999 --n "$N" --device "$DEVICE" \
  --out "$OUT/selection-999.json"
python3 -m faithproxy.benchmarks.evaluation.flywheel_loop generate "${MODELS[@]}" "${HELDOUT_ARGS[@]}" --n "$N" --device "$DEVICE" \
  --per-model --out "$OUT/heldout.json"
