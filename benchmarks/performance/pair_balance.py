"""One before/after ratio from two cpu_per_token pairs run with their slots swapped.

    .venv/bin/python -m faithproxy.benchmarks.performance.pair_balance AFTER_VS_BEFORE.json \\
        BEFORE_VS_AFTER.json --json out.json

cpu_per_token measures one faithproxy in its "measured" slot and another in its "before" slot. On these
2-core machines the slot itself can move a figure by about 5% (the same two sites gave ×1.045 in one order
and ×1.051 the other way round, each time against the measured slot), more than a change under test. Run
the pair twice, the second time with `--after-site` and `--baseline` swapped: the slot's bias multiplies
both ratios alike and cancels in

    balanced = sqrt(ratio_first / ratio_swapped)

(ratio = measured slot ÷ before slot, as each file's `comparison.after_over_before` holds it). The goal of
a change that must not cost CPU is balanced ≤ 1 for each configuration both files measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.shapesworld_bench import git_commit


def balanced(first: dict[str, float], swapped: dict[str, float]) -> dict[str, float]:
    """Per configuration both hold: the geometric mean of the first ratio and the swapped one's inverse."""
    return {name: round(math.sqrt(first[name] / swapped[name]), 3) for name in first if name in swapped}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faithproxy.benchmarks.performance.pair_balance")
    parser.add_argument("first", help="cpu_per_token's file of the pair: the change in the measured slot")
    parser.add_argument("swapped", help="the same pair with the slots swapped (the change in the before slot)")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    files = [json.loads(Path(p).read_text(encoding="utf-8")) for p in (args.first, args.swapped)]
    ratios = [f["comparison"]["after_over_before"] for f in files]
    quiet = [bool(f["comparison"].get("quiet")) for f in files]
    result: dict[str, Any] = {
        "what": "after ÷ before, CPU per streamed token, cpu_per_token's slot bias cancelled over both slot orders",
        "command": "python -m faithproxy.benchmarks.performance.pair_balance "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "uname": " ".join(platform.uname()[:3]),
            "cpus": os.cpu_count(),
            "loadavg_at_write": os.getloadavg(),
        },
        "inputs": {"first": args.first, "swapped": args.swapped},
        "ratios": {"first": ratios[0], "swapped": ratios[1]},
        "both_quiet": all(quiet),
        "balanced": balanced(*ratios),
    }
    result["goals"] = {
        "rule": "balanced <= 1.0 (no more CPU per token after than before), from two quiet runs",
        **{
            name: {"balanced": value, "goal": 1.0, "met": all(quiet) and value <= 1.0}
            for name, value in result["balanced"].items()
        },
    }
    for name, value in result["balanced"].items():
        print(f"{name:24s} first ×{ratios[0][name]:.3f}  swapped ×{ratios[1][name]:.3f}  balanced ×{value:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
