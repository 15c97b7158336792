"""The strictly sequential verification loop, kept for the pipeline benchmark only.

One step per upstream request: each step is checked before the next one is decoded. After every
checked step the round that read it is dropped (vLLM stops decoding) and a new request continues after
it, just as after a correction. The production loop (server/correction.py) reads on while a step is
checked; the pipeline benchmark measures what not doing so would cost.

    python -m faithproxy.benchmarks.performance.sequential --upstream URL --port N

serves the proxy with this variant: the same as `faithproxy serve` in everything else.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from faithproxy.faithcore.context import ChainContext
from faithproxy.server.correction import CorrectionCore, Rules


class SequentialCore(CorrectionCore):
    """The correction core, checking one step at a time and stopping the model while it does."""

    def __init__(self, rules: Rules, ctx: ChainContext, **shared: Any) -> None:
        super().__init__(dataclasses.replace(rules, max_batch_steps=1), ctx, **shared)

    def _after_batch(self) -> None:
        if self._end is None:  # the model is still decoding: stop it, and continue in a new request
            self._drop_round()
            self._continue()


def main(argv: Sequence[str] | None = None) -> int:
    from faithproxy.server.cli import add_server_commands
    from faithproxy.server.session import ChainSession

    # The server has no switch for this on purpose: only this benchmark process swaps the core in.
    ChainSession.core_class = SequentialCore
    parser = argparse.ArgumentParser(prog="sequential", description=__doc__.splitlines()[0])
    add_server_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
