"""The `faithproxy` command: serve, demo, segment, detectors."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app
    from server.settings import Settings

    overrides = {
        k: v
        for k, v in {
            "upstream_url": args.upstream,
            "host": args.host,
            "port": args.port,
            "trace_path": args.traces,
        }.items()
        if v is not None
    }
    settings = Settings(**overrides)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
    )
    return 0


def _segment(args: argparse.Namespace) -> int:
    """Reads text on stdin incrementally and prints one JSON object per step (the server's code path)."""
    from faithcore.segmenter import StepSegmenter

    segmenter = StepSegmenter()
    out = sys.stdout
    while chunk := sys.stdin.read(4096):
        for segment in segmenter.feed(chunk):
            out.write(json.dumps({"index": segment.index, "text": segment.text}, ensure_ascii=False) + "\n")
    for segment in segmenter.flush():
        if segment.text:
            out.write(json.dumps({"index": segment.index, "text": segment.text}, ensure_ascii=False) + "\n")
    return 0


def _detectors(args: argparse.Namespace) -> int:
    from detectors.registry import DETECTORS

    for name, entry in DETECTORS.items():
        state = "available" if entry.available else "planned"
        print(f"{name:<8} {state:<10} {entry.description}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from server.demo import run_demo

    return run_demo(workdir=args.workdir, keep=args.keep, world=args.world, questions=args.questions)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faithproxy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy (settings also from FAITHPROXY_* env)")
    serve.add_argument("--upstream", help="vLLM base URL, e.g. http://127.0.0.1:8000")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--traces", help="append one JSON line per request to this file")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(func=_serve)

    demo = sub.add_parser("demo", help="real vLLM on CPU + local judge + proxy, a few questions, printed live")
    demo.add_argument("--workdir", default="var/demo", help="where models, logs and traces go")
    demo.add_argument("--keep", action="store_true", help="leave the servers running (Ctrl-C stops them)")
    demo.add_argument(
        "--world",
        choices=["shapesworld", "fixture"],
        default="shapesworld",
        help="shapesworld: the committed model's own mistakes, pixel judge; fixture: planted mistakes, oracle",
    )
    demo.add_argument("--questions", type=int, default=5, help="shapesworld: how many held-out questions")
    demo.set_defaults(func=_demo)

    segment = sub.add_parser("segment", help="split stdin into steps, one JSON object per line")
    segment.set_defaults(func=_segment)

    detectors = sub.add_parser("detectors", help="list the detectors")
    detectors.set_defaults(func=_detectors)

    # Offline tools live in benchmarks/ (they import the server, not the other way round): these two
    # subcommands only hand the rest of the command line over, imported when used.
    # `main` hands their arguments over before parsing; they are listed here for `faithproxy -h`.
    for name, help_text in DELEGATED_HELP.items():
        sub.add_parser(name, help=help_text)
    return parser


DELEGATED = {"bench": "benchmarks.cli", "probe": "benchmarks.probe_cli"}
DELEGATED_HELP = {
    "bench": "labelled chains, metrics, replay, benchmark runs (faithproxy bench -h)",
    "probe": "train and evaluate hidden-state probes (faithproxy probe -h)",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        return int(importlib.import_module(DELEGATED[argv[0]]).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
