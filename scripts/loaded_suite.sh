#!/usr/bin/env bash
# The whole test suite with both cores loaded (issue 51, part 5): stress-ng keeps every core busy beside
# pytest, so a test whose margin is a guess about the machine's speed fails here. One run per call; the
# result of run N goes to benchmarks/results/analysis/loaded-suite-<commit>-run<N>.json (the command,
# the commit, the date, the machine, the load at start and end, the wall time, pytest's summary and
# every failure), so runs can be spread over sessions and each is kept whatever it shows.
#   scripts/loaded_suite.sh N [PYTEST_ARGS]     (needs .venv and the fixture model: scripts/test.sh's installs)
# Run it alone on the machine: anything else running adds load this run does not record.
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:?usage: scripts/loaded_suite.sh N [PYTEST_ARGS]}
shift
commit=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit+dirty"
out=benchmarks/results/analysis/loaded-suite-${commit%+dirty}-run$run.json
mkdir -p var/loaded-suite
log=var/loaded-suite/run$run.log
xml=var/loaded-suite/run$run.xml
command -v stress-ng >/dev/null || { echo "stress-ng is missing (Debian: apt-get install stress-ng)" >&2; exit 2; }
cpus=$(nproc)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
stress-ng --cpu "$cpus" --cpu-method matrixprod --quiet &
stress=$!
trap 'kill $stress 2>/dev/null || true' EXIT
started=$(date +%s)
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --junitxml="$xml" "$@" > "$log" 2>&1
rc=$?
set -e
wall=$(( $(date +%s) - started ))
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
kill $stress 2>/dev/null || true
.venv/bin/python - "$out" "$run" "$commit" "$rc" "$wall" "$load_start" "$load_end" "$cpus" "$log" "$xml" "$*" <<'PY'
import json, platform, re, sys, time
import xml.etree.ElementTree as ET
out, run, commit, rc, wall, load_start, load_end, cpus, log, xml, args = sys.argv[1:]
lines = open(log, encoding="utf-8", errors="replace").read().splitlines()
failures = []
try:
    for case in ET.parse(xml).getroot().iter("testcase"):
        for kind in ("failure", "error"):
            hit = case.find(kind)
            if hit is not None:
                failures.append({"test": f"{case.get('classname')}::{case.get('name')}", "kind": kind,
                                 "message": (hit.get("message") or "")[:300]})
except (OSError, ET.ParseError) as exc:
    failures.append({"test": "(no junit file)", "kind": "error", "message": str(exc)})
summary = [line for line in lines if re.search(r"\d+ (passed|failed|errors?)\b", line)][-1:]
result = {
    "what": "issue 51 part 5: the whole test suite with every core loaded by stress-ng beside it",
    "command": f"bash scripts/loaded_suite.sh {run} {args}".rstrip(),
    "load": f"stress-ng --cpu {cpus} --cpu-method matrixprod, for the whole run",
    "commit": commit,
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "machine": {"uname": " ".join(platform.uname()[:3]), "cpus": int(cpus),
                "loadavg_at_start": [float(x) for x in load_start.split()],
                "loadavg_at_end": [float(x) for x in load_end.split()]},
    "run": int(run),
    "rc": int(rc),
    "wall_s": int(wall),
    "pytest_summary": summary,
    # the summary's counts as numbers (what a page links to), and the goal: no failure under load
    "counts": {("errors" if kind.startswith("error") else kind): int(n)
               for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b", " ".join(summary))},
    "failures": failures,
    "goals": {"rule": "no test fails or errors with every core loaded: pytest's exit status 0 and no failure or error in its junit file",
              "no_failure": {"failures": len(failures), "rc": int(rc), "met": int(rc) == 0 and not failures}},
}
open(out, "w", encoding="utf-8").write(json.dumps(result, indent=2) + "\n")
print(out, "rc", rc, "wall", wall, "failures", len(failures))
PY
