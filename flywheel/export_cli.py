"""`faithproxy export pairs`: corrected steps as TRL preference pairs (flywheel/pairs.py).

    faithproxy export pairs --traces var/traces.jsonl --images var/images --out pairs.jsonl
    faithproxy export pairs --redis redis://localhost:6379/0 --min-confidence 0.8 --heldout 0.1 --out pairs.jsonl

Image files are named relative to the pairs file's folder. With `--heldout F` the pairs of a share F
of the images go to `<out stem>.heldout.jsonl` beside `--out`. A summary (pairs per split, what was left
out and why) is printed as JSON and written to `<out stem>.summary.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from faithproxy.flywheel.images import ImageIndex
from faithproxy.flywheel.pairs import HELDOUT, TRAIN, ExportOptions, export_pairs, write_jsonl
from faithproxy.flywheel.records import FlywheelError, Recorded, read_redis, read_traces


def heldout_path(out: Path) -> Path:
    return out.with_name(out.stem + ".heldout.jsonl")


def summary_path(out: Path) -> Path:
    return out.with_name(out.stem + ".summary.json")


def relative_images(rows: list[dict[str, Any]], folder: Path) -> None:
    """Image files named relative to the pairs file's folder, so the file and its images move together
    (flywheel/data.py resolves them the same way); data URLs stay as they are."""
    for row in rows:
        row["images"] = [
            ref if ref.startswith("data:") else os.path.relpath(Path(ref).resolve(), folder.resolve())
            for ref in row["images"]
        ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faithproxy export", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    pairs = sub.add_parser("pairs", help="corrected steps as TRL vision DPO pairs (JSON lines)")
    pairs.add_argument("--traces", type=Path, nargs="*", default=[], help="trace files (FAITHPROXY_TRACE_PATH)")
    pairs.add_argument("--redis", help="a Redis URL holding the proxy's reports (FAITHPROXY_REPORTS_URL)")
    pairs.add_argument(
        "--images",
        type=Path,
        nargs="*",
        default=[],
        help="folders holding the images the requests sent (matched by the sha256 of their bytes)",
    )
    pairs.add_argument("--out", type=Path, required=True, help="the pairs (JSON lines)")
    pairs.add_argument("--min-confidence", type=float, help="leave out flags the detector was less sure of")
    pairs.add_argument("--heldout", type=float, default=0.0, help="share of images held out (0..1)")
    pairs.add_argument("--keep-duplicates", action="store_true", help="keep pairs that repeat an earlier one")
    return parser


def _requests(traces: Sequence[Path], redis_url: str | None) -> Iterator[Recorded]:
    yield from read_traces(traces)
    if redis_url:
        yield from read_redis(redis_url)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.traces and not args.redis:
        print("faithproxy export pairs: give --traces FILE... or --redis URL", file=sys.stderr)
        return 2
    if not 0.0 <= args.heldout < 1.0:
        print("faithproxy export pairs: --heldout must be in [0, 1)", file=sys.stderr)
        return 2
    options = ExportOptions(
        min_confidence=args.min_confidence, heldout_fraction=args.heldout, dedupe=not args.keep_duplicates
    )
    try:
        exported = export_pairs(_requests(args.traces, args.redis), ImageIndex(args.images), options)
    except (FlywheelError, OSError) as exc:
        print(f"faithproxy export pairs: {exc}", file=sys.stderr)
        return 1
    for rows in exported.pairs.values():
        relative_images(rows, args.out.parent)
    write_jsonl(args.out, exported.pairs[TRAIN])
    if args.heldout > 0:
        write_jsonl(heldout_path(args.out), exported.pairs[HELDOUT])
    summary = exported.summary() | {"out": str(args.out), "options": vars(options)}
    summary_path(args.out).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
