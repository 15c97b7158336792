"""The server's subcommands of `faithproxy`: serve, segment, detectors, report.

The whole command is assembled one layer up, in faithproxy/cli.py; this module adds only what the server
itself offers, so that the server never imports the benchmarks or the demo.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _serve(args: argparse.Namespace) -> int:
    from faithproxy.server.settings import Settings

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
    if args.workers > 1:
        return _serve_workers(settings, overrides, args)
    from uvicorn.config import STARTUP_FAILURE

    from faithproxy.server.admission.connections import HTTP_PROTOCOL
    from faithproxy.server.app import create_app
    from faithproxy.server.runtime import uvicorn_server

    started = uvicorn_server.run(  # uvicorn.run's single process, without the housekeeping tick
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
        http=HTTP_PROTOCOL,  # client header, body and idle timeouts (server/admission/connections.py)
    )
    return 0 if started else STARTUP_FAILURE


def _serve_workers(settings: Any, overrides: dict[str, Any], args: argparse.Namespace) -> int:
    """N worker processes (server/runtime/workers.py): each builds its app from the environment, where the
    command line's settings are put first, and keeps its metrics in the shared multiprocess folder."""
    from faithproxy.server.admission.connections import HTTP_PROTOCOL
    from faithproxy.server.runtime.supervisor import run_workers
    from faithproxy.server.runtime.workers import metrics_folder, reports_file

    for name, value in overrides.items():
        os.environ[f"FAITHPROXY_{name.upper()}"] = str(value)
    # Without a configured report file each worker would keep its own reports, and a lookup that
    # reaches another worker would find none. Reports in Redis need no file: every worker reads it.
    shared_file = settings.reports_max_count > 0 and settings.reports_url is None
    with metrics_folder(), reports_file(settings.reports_path, keep=shared_file):
        run_workers(  # uvicorn's supervisor, each worker without the housekeeping tick
            "faithproxy.server.app:create_app",
            workers=args.workers,
            host=settings.host,
            port=settings.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=5,
            http=HTTP_PROTOCOL,
        )
    return 0


def _segment(args: argparse.Namespace) -> int:
    """Reads text on stdin incrementally and prints one JSON object per step, with the kind the step
    typer gives it (the server's code path: the same segmenter and typer)."""
    from faithproxy.faithcore.kinds import classify_step
    from faithproxy.faithcore.segmenter import StepSegmenter

    segmenter = StepSegmenter()
    out = sys.stdout

    def write(index: int, text: str) -> None:
        line = {"index": index, "text": text, "kind": classify_step(text).value}
        out.write(json.dumps(line, ensure_ascii=False) + "\n")

    while chunk := sys.stdin.read(4096):
        for segment in segmenter.feed(chunk):
            write(segment.index, segment.text)
    for segment in segmenter.flush():
        if segment.text:
            write(segment.index, segment.text)
    return 0


def _detectors(args: argparse.Namespace) -> int:
    from faithproxy.detectors.registry import DETECTORS

    for name, description in DETECTORS.listing():
        print(f"{name:<8} {description}")
    return 0


def _report(args: argparse.Namespace) -> int:
    """The report pages of a trace file's requests, as static HTML files (the server's templates)."""
    from faithproxy.server.observe.report_page import read_trace, write_static

    try:
        count = write_static(read_trace(args.trace), args.html)
    except (OSError, ValueError) as e:
        print(f"faithproxy report: {e}", file=sys.stderr)
        return 1
    print(f"{count} report pages and index.html written to {args.html}")
    return 0


def add_server_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds serve, segment, detectors and report to the `faithproxy` command's subparsers."""
    serve = sub.add_parser("serve", help="run the proxy (settings also from FAITHPROXY_* env)")
    serve.add_argument("--upstream", help="vLLM base URL, e.g. http://127.0.0.1:8000")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--traces", help="append one JSON line per request to this file")
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (uvicorn's); metrics are added up across them (Prometheus multiprocess mode)",
    )
    serve.set_defaults(func=_serve)

    segment = sub.add_parser(
        "segment", help="split stdin into steps, one JSON object per line with the kind the step typer gives"
    )
    segment.set_defaults(func=_segment)

    detectors = sub.add_parser("detectors", help="list the detectors")
    detectors.set_defaults(func=_detectors)

    report = sub.add_parser("report", help="render a trace file's requests as HTML report pages (offline)")
    report.add_argument("trace", help="a trace file (serve --traces, one JSON line per request)")
    report.add_argument("--html", required=True, metavar="OUT", help="folder to write index.html and the pages to")
    report.set_defaults(func=_report)
