#!/usr/bin/env bash
# Runs `faithproxy bench heldout run OPTIONS [--rerun]` from a clean git worktree of HEAD, so the result
# names a commit with nothing uncommitted on top, even when this checkout is shared and dirty. The
# worktree borrows this checkout's .venv: a sitecustomize points the editable install's package map
# at the worktree (in this process and every child). The result is copied back beside the options file.
#   bash benchmarks/evaluation/heldout_worktree.sh benchmarks/results/heldout/shapesworld-SEED.options.json
set -euo pipefail
root=$(git rev-parse --show-toplevel)
head=$(git rev-parse --short HEAD)
wt="$root/var/heldout-worktree-$head"
[ -d "$wt" ] || git worktree add --detach "$wt" HEAD
mkdir -p "$wt/var/shim"
cat >"$wt/var/shim/sitecustomize.py" <<PY
import sys

for _name, _module in list(sys.modules.items()):
    if _name.startswith("__editable___faithproxy") and _name.endswith("_finder"):
        _module.MAPPING.update({k: v.replace("$root", "$wt", 1) for k, v in _module.MAPPING.items()})
PY
cd "$wt"
PYTHONPATH="$wt/var/shim" "$root/.venv/bin/python" -c \
    "import faithproxy.benchmarks, sys; assert faithproxy.benchmarks.__path__[0].startswith('$wt'), faithproxy.benchmarks.__path__"
PYTHONPATH="$wt/var/shim" "$root/.venv/bin/python" -m faithproxy.benchmarks.evaluation.heldout run "$@"
cp -n benchmarks/results/heldout/*.json benchmarks/results/heldout/*.md benchmarks/results/heldout/*.png \
    "$root/benchmarks/results/heldout/" 2>/dev/null || true
