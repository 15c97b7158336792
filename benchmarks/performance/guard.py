"""Today's CPU per token beside the last committed result: run before every change to the streaming path.

    .venv/bin/python -m faithproxy.benchmarks.performance.guard [--requests 32] [--model-dir DIR | --vllm-url URL]
        [--skip-ceiling] [--json today.json]

Runs cpu_per_token.py (real vLLM; the streamed configurations of issue 43's goals) and ceiling.py (the
fast upstream, one worker) on the code on the path, then prints each figure beside the same figure of
the newest committed result of each benchmark in benchmarks/results/performance/ (newest by its last
commit; `--against-cpu FILE` / `--against-ceiling FILE` to pick one) and the goal where there is one.
It prints; it never fails on a figure: this machine is shared and noisy, so a difference is a reason
to run the interleaved A/B (`--baseline SITE` of either benchmark), not a verdict.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.performance import ceiling, cpu_per_token

RESULTS = Path(__file__).resolve().parents[1] / "results" / "performance"
GOALS_US = cpu_per_token.GOALS_US  # µs of proxy CPU per streamed completion token in front of real vLLM
CONFIGS = "off/none/stream,correct/none/stream,correct/judge/stream,detect/judge/stream"


def newest_committed(pattern: str, results: Path = RESULTS) -> Path | None:
    """The file matching `pattern` in `results` whose last commit is the newest (None: none committed)."""
    best: tuple[int, Path] | None = None
    for path in results.glob(pattern):
        out = subprocess.run(
            ["git", "log", "-1", "--format=%ct", "--", path.name], cwd=results, capture_output=True, text=True
        ).stdout.strip()
        if out and (best is None or int(out) > best[0]):
            best = (int(out), path)
    return None if best is None else best[1]


def _cpu_rows(result: dict[str, Any]) -> dict[str, float | None]:
    """config name -> µs/token of the proxy under test (the first one in the result, not a baseline)."""
    proxies = result.get("proxies") or {}
    mine = proxies.get("faithproxy") or next(iter(proxies.values()), {})
    return {name: row.get("cpu_us_per_token") for name, row in mine.items()}


def _ceiling_rows(result: dict[str, Any]) -> dict[str, float | None]:
    return {mode: by.get("1 worker", {}).get("cpu_us_per_token") for mode, by in result.get("ceiling", {}).items()}


def compare(today: dict[str, float | None], then: dict[str, float | None], goals: dict[str, float]) -> list[str]:
    lines = [f"{'figure':<26} {'today':>9} {'committed':>10} {'goal':>7}"]
    for name in today:
        goal = goals.get(name)
        lines.append(
            f"{name:<26} {_fmt(today[name]):>9} {_fmt(then.get(name)):>10} {'' if goal is None else _fmt(goal):>7}"
        )
    return lines


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32, help="cpu_per_token: requests per configuration")
    parser.add_argument("--model-dir")
    parser.add_argument("--vllm-url")
    parser.add_argument("--skip-ceiling", action="store_true")
    parser.add_argument("--against-cpu", help="default: the newest committed cpu-per-token-*.json")
    parser.add_argument("--against-ceiling", help="default: the newest committed ceiling-vs-*.json (unpaced)")
    parser.add_argument("--results", default=str(RESULTS), help="the committed results (a git checkout's folder)")
    parser.add_argument("--today", help="print the figures of this earlier guard --json instead of measuring")
    parser.add_argument("--json", help="write today's figures here")
    args = parser.parse_args(argv)
    results = Path(args.results)
    if args.today:
        today: dict[str, Any] = json.loads(Path(args.today).read_text())
    else:
        today = measure(args)
    against = Path(args.against_cpu) if args.against_cpu else newest_committed("cpu-per-token-*.json", results)
    then = json.loads(against.read_text()) if against else {}
    print(f"CPU per streamed token in front of vLLM, µs (committed: {against})")
    print("\n".join(compare(_cpu_rows(today["cpu_per_token"]), _cpu_rows(then), GOALS_US)))
    if "ceiling" in today:
        against = Path(args.against_ceiling) if args.against_ceiling else newest_committed("ceiling-vs-*.json", results)
        then = json.loads(against.read_text()) if against else {}
        print(f"\nCPU per token at the ceiling (fast upstream, 1 worker), µs (committed: {against})")
        print("\n".join(compare(_ceiling_rows(today["ceiling"]), _ceiling_rows(then), {})))
    if args.json:
        Path(args.json).write_text(json.dumps(today, indent=2) + "\n")
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """cpu_per_token and (without --skip-ceiling) a short ceiling run, on the code on the path."""
    cpu_args = ["--requests", str(args.requests), "--rounds", "1", "--idle-s", "0", "--configs", CONFIGS]
    cpu_args += ["--model-dir", args.model_dir] if args.model_dir else []
    cpu_args += ["--vllm-url", args.vllm_url] if args.vllm_url else []
    today: dict[str, Any] = {"cpu_per_token": cpu_per_token.run(cpu_per_token.build_parser().parse_args(cpu_args))}
    if not args.skip_ceiling:
        quick = ["--windows", "1", "--requests", "64", "--concurrency", "16", "--workers", "1"]
        today["ceiling"] = ceiling.run(ceiling.build_args(quick))
    return today


if __name__ == "__main__":
    sys.exit(main())
