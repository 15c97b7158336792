"""Where a proxy's CPU goes, per stage of a chunk's path, from py-spy's collapsed stacks.

    .venv/bin/python -m faithproxy.benchmarks.performance.profile_breakdown STACKS.txt [...] [--json out.json]

STACKS.txt is what `py-spy record --format raw` writes (cpu_per_token.py `--profile DIR` writes
DIR/<proxy>.txt): one line per distinct stack, frames root first separated by `;`, then a count. Each
sample goes to the stage of the frame nearest its leaf that names one (STAGES, first match wins per
frame), so a JSON encode called by the door's chunk renderer counts as "write", one called by the judge
client as "check" (any sample under the judge client is "check"). A sample whose leaf is the event
loop's own frame (`Runner.run`: uvloop's C code, which py-spy cannot see into: epoll, socket reads and
writes, scheduling callbacks) is "event loop". py-spy cannot tell uvloop's wait in epoll from its work,
so "event loop" holds the idle time as well: the shares of the other stages are comparable with one
another, and the measured CPU per token (cpu_per_token.py's `kernel_us_per_token`) says how much of the
whole is the kernel's.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

CHECK = re.compile(r"faithproxy/(detectors|regenerators)/|clients/(judge|anthropic|openai_j|call_gate)")
# (stage, pattern on one frame); a frame is "function (file:line)"
STAGES: list[tuple[str, re.Pattern[str]]] = [
    ("metrics", re.compile(r"prometheus_client/|server/observe/(metrics|step_metrics)\.py")),
    ("traces", re.compile(r"opentelemetry/|server/observe/")),
    (
        "check (judge client)",
        re.compile(
            r"faithproxy/(detectors|regenerators)/|clients/(judge|anthropic|openai_j|call_gate)"
            r"|anthropic/|openai/|httpx|httpcore|pydantic"
        ),
    ),
    ("segment", re.compile(r"faithcore/segmenter\.py|faithcore/punkt")),
    ("type", re.compile(r"faithcore/(step_typer|keyword_typer|kinds)\.py")),
    ("parse", re.compile(r"faithcore/correction/wire\.py|clients/sse\.py")),
    ("read upstream", re.compile(r"clients/(upstream_http|vllm)\.py|server/chain/reader\.py")),
    ("write", re.compile(r"uvicorn/|anyio/|starlette/responses|server/protocol/sse\.py|server/doors/")),
    ("admission", re.compile(r"server/admission/")),
    ("machine", re.compile(r"faithcore/")),
    ("driver", re.compile(r"server/chain/")),
]
EVENT_LOOP = "event loop"
OTHER = "other"


def stage_of(frames: Sequence[str]) -> str:
    if frames and frames[-1].startswith("Runner.run "):
        return EVENT_LOOP
    if any(CHECK.search(frame) for frame in frames):  # the judge client's socket writes are its own
        return "check (judge client)"
    for frame in reversed(frames):
        for stage, pattern in STAGES:
            if pattern.search(frame):
                return stage
    return OTHER


def breakdown(text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        counts[stage_of(stack.split(";"))] += int(count)
    return counts


def shares(counts: Counter[str]) -> dict[str, float]:
    total = sum(counts.values()) or 1
    return {stage: round(100 * n / total, 1) for stage, n in counts.most_common()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stacks", nargs="+", help="py-spy --format raw files")
    parser.add_argument("--json", help="write the shares here")
    args = parser.parse_args(argv)
    out = {}
    for path in args.stacks:
        counts = breakdown(Path(path).read_text())
        python = Counter({stage: n for stage, n in counts.items() if stage != EVENT_LOOP})
        out[path] = {
            "samples": sum(counts.values()),
            "percent": shares(counts),
            "percent_of_python": shares(python),  # the event loop's samples (idle included) left out
        }
        print(f"{path}: {out[path]['samples']} samples; % of all, % of those in Python code")
        for stage, pct in out[path]["percent"].items():
            print(f"  {stage:22} {pct:5.1f}%  {out[path]['percent_of_python'].get(stage, ''):>5}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
