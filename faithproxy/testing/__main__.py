"""Serve a FakeUpstream on 127.0.0.1 from the command line (benchmarks, launcher tests).

python -m faithproxy.testing --port 8100 [--chunks 8]     Counted answers (scripts.py)
python -m faithproxy.testing --port 8100 --chain          Chain answers (chains.py)
"""

from __future__ import annotations

import argparse

import uvicorn

from faithproxy.testing.chains import Chain
from faithproxy.testing.scripts import Counted, Script
from faithproxy.testing.upstream import FakeUpstream


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faithproxy.testing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=8, help="content chunks when a request names none")
    parser.add_argument("--chain", action="store_true", help="answer with reasoning chains (chains.py)")
    parser.add_argument("--token-s", type=float, default=0.02, help="--chain: seconds per token")
    args = parser.parse_args(argv)
    script: Script = Chain(token_s=args.token_s) if args.chain else Counted(args.chunks)
    # Not recorded: a benchmark's upstream serves hundreds of thousands of requests.
    upstream = FakeUpstream(script, record=False)
    uvicorn.run(upstream, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, ws="none",
                backlog=4096)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
