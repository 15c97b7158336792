"""Entry point of the CPU vLLM image: tinyvlm.serve's flags (the ones the tests run), on all interfaces.

Extra arguments are passed on to vLLM (a later flag wins over an earlier one). Environment: MODEL_DIR,
PORT, SERVED_MODEL_NAME (default: the tests' "fixture-vlm").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from faithproxy.benchmarks.tinyvlm.serve import CPU_ENV, SERVED_MODEL_NAME, vllm_command


def main() -> None:
    command = vllm_command(
        Path(os.environ.get("MODEL_DIR", "/models/fixture-vlm")),
        int(os.environ.get("PORT", "8000")),
        os.environ.get("SERVED_MODEL_NAME", SERVED_MODEL_NAME),
        ["--host", "0.0.0.0", *sys.argv[1:]],  # a container is reached through its own interface
    )
    os.execvpe(command[0], command, {**os.environ, **CPU_ENV})


if __name__ == "__main__":
    main()
