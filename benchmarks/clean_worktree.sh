#!/usr/bin/env bash
# Runs a command from a clean git worktree of HEAD, so a result names a commit with nothing uncommitted
# on top even when this checkout is shared and dirty; new files under benchmarks/results/ are copied back
# (an existing file is never overwritten). The worktree borrows this checkout's .venv: a sitecustomize
# points the editable install's package map at the worktree, in the command and in every child it starts.
#   bash benchmarks/clean_worktree.sh faithproxy bench heldout run benchmarks/results/heldout/X.options.json
#   bash benchmarks/clean_worktree.sh python -m faithproxy.benchmarks.record --out benchmarks/results/Y.json -- ...
set -euo pipefail
root=$(git rev-parse --show-toplevel)
head=$(git rev-parse --short HEAD)
wt="$root/var/worktree-$head"
[ -d "$wt" ] || git worktree add --detach "$wt" HEAD >/dev/null
mkdir -p "$wt/var/shim"
cat >"$wt/var/shim/sitecustomize.py" <<PY
import sys

for _name, _module in list(sys.modules.items()):
    if _name.startswith("__editable___faithproxy") and _name.endswith("_finder"):
        _module.MAPPING.update({k: v.replace("$root", "$wt", 1) for k, v in _module.MAPPING.items()})
PY
export PYTHONPATH="$wt/var/shim" PATH="$root/.venv/bin:$PATH"
cd "$wt"
python -c "import faithproxy.benchmarks as b; assert b.__path__[0].startswith('$wt'), b.__path__"
status=0
"$@" || status=$?
(cd "$wt" && git ls-files --others --exclude-standard benchmarks/results) | while read -r path; do
    if [ ! -e "$root/$path" ]; then mkdir -p "$root/$(dirname "$path")" && cp "$wt/$path" "$root/$path"; fi
done
exit $status
