"""The `faithproxy` command: the one place that knows every layer's subcommands.

The serving commands come from the server (`serve`, `segment`, `detectors`), the offline tools from
benchmarks/ (`bench`, `probe`) and flywheel/ (`export`, `train`), and `demo` from demo.py beside this
file. Each is imported only when it is run, so `faithproxy serve` never loads the benchmarks, and the
server never imports anything above it.

`pip install faithproxy` brings the server's libraries only; the tools' come with extras (pyproject.toml).
A command that reaches for a library of a missing extra says which one to install, and exits 2.
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
    "export": (
        "faithproxy.flywheel.export_cli",
        "corrected steps as preference pairs for TRL (faithproxy export pairs -h)",
    ),
    "train": ("faithproxy.flywheel.train_cli", "tune a model on exported pairs (faithproxy train dpo -h)"),
}


# The top-level modules each extra of pyproject.toml provides (tests/test_extras.py keeps the two in step).
EXTRAS = {
    "probe": ("numpy", "safetensors"),
    "bench": ("numpy", "PIL", "matplotlib", "tqdm", "pyarrow", "tokenizers", "safetensors"),
    "train": ("torch", "transformers", "tokenizers", "PIL", "safetensors", "numpy", "trl", "datasets"),
}
# The extra each command is written against: a module several extras provide (numpy) is named by it.
COMMAND_EXTRA = {"serve": "probe", "bench": "bench", "probe": "bench", "demo": "train", "train": "train"}
MISSING_EXTRA = 2  # the exit status of a command whose extra is not installed


def extra_for(command: str, module: str) -> str | None:
    """The extra that provides the top-level `module` to `command`, None for a module of no extra."""
    own = COMMAND_EXTRA.get(command)
    if own is not None and module in EXTRAS[own]:
        return own
    return next((extra for extra, modules in EXTRAS.items() if module in modules), None)


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


def _run(argv: list[str]) -> int:
    if argv and argv[0] in DELEGATED:
        module, _ = DELEGATED[argv[0]]
        return int(importlib.import_module(module).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(argv)
    except ModuleNotFoundError as exc:
        # Only a library of an extra is explained; a missing module of faithproxy itself is a bug to see.
        command = argv[0] if argv else ""
        extra = extra_for(command, (exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"faithproxy {command} needs the {extra!r} extra ({exc.name} is not installed): "
            f"pip install 'faithproxy[{extra}]'",
            file=sys.stderr,
        )
        return MISSING_EXTRA


if __name__ == "__main__":
    sys.exit(main())
