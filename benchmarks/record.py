"""Runs a benchmark command and keeps what it printed with where it came from: a result file a reader can
check a published figure against.

    python -m faithproxy.benchmarks.record --out benchmarks/results/judge-cost.json -- \
        python -m faithproxy.benchmarks.performance.judge_cost --json

The file holds `command`, `commit` (`+dirty` when tracked files differ from it: run from
`benchmarks/clean_worktree.sh` for a clean one), `date`, `machine` (cores, memory, GPU or none, load),
`wall_s`, and `output`: the command's standard output, parsed as JSON when it is JSON, else its lines.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.heldout import machine, now
from faithproxy.benchmarks.evaluation.shapesworld_bench import git_commit


def record(command: list[str]) -> dict[str, Any]:
    started, host, commit = now(), machine(), git_commit()
    clock = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise SystemExit(f"the command failed ({run.returncode}):\n{run.stderr[-4000:]}")
    try:
        output: Any = json.loads(run.stdout)
    except json.JSONDecodeError:
        output = run.stdout.splitlines()
    shown = ["python" if part == sys.executable else part for part in command]
    return {
        "command": shlex.join(shown),
        "commit": commit,
        "date": started,
        "machine": host,
        "wall_s": round(time.monotonic() - clock, 1),
        "output": output,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faithproxy.benchmarks.record", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the result file (never overwritten)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: a result file is never overwritten")
    result = record(command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
