"""What every study's result file records beside its command: the commit, the date and the machine with
its load at the start and the end (a figure from a loaded machine is read as such; tests/test_figures.py
requires the fields)."""

from __future__ import annotations

import os
import time
from typing import Any


def load_now() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_record(started: float, load_at_start: list[float]) -> dict[str, Any]:
    """`commit`, `date` (of `started`, a time.time()) and `machine` for a run that is ending now."""
    from faithproxy.benchmarks.evaluation.shapesworld_bench import git_commit

    return {
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": load_at_start, "loadavg_at_end": load_now()},
    }
