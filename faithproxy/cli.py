"""The `faithproxy` command: the one place that knows every layer's subcommands.

The serving commands come from the server (`serve`, `segment`, `detectors`), the offline tools from
benchmarks/ (`bench`, `probe`), and `demo` from demo.py beside this file. Each is imported only when it
is run, so `faithproxy serve` never loads the benchmarks, and the server never imports anything above it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Subcommands that parse their own arguments: the rest of the command line is handed over unparsed.
DELEGATED = {
    "bench": (
        "faithproxy.benchmarks.evaluation.cli",
        "labelled chains, metrics, replay, benchmark runs (faithproxy bench -h)",
    ),
    "probe": ("faithproxy.benchmarks.probes.probe_cli", "train and evaluate hidden-state probes (faithproxy probe -h)"),
}


def build_parser() -> argparse.ArgumentParser:
    from faithproxy.demo import add_demo_command
    from faithproxy.server.cli import add_server_commands

    parser = argparse.ArgumentParser(prog="faithproxy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_server_commands(sub)
    add_demo_command(sub)
    # `main` hands these over before parsing; they are listed here for `faithproxy -h`.
    for name, (_, help_text) in DELEGATED.items():
        sub.add_parser(name, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        module, _ = DELEGATED[argv[0]]
        return int(importlib.import_module(module).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
