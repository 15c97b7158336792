"""`faithproxy serve --workers N`: N uvicorn worker processes behind one socket, one /metrics for all.

uvicorn's supervisor binds the socket and starts N workers; the kernel hands each connection to one
of them. Everything a worker keeps in memory is its own (the upstream connections, the concurrency
limit: FAITHPROXY_MAX_CONCURRENT_REQUESTS applies per worker), except:

- Metrics. prometheus_client's multiprocess mode: with `PROMETHEUS_MULTIPROC_DIR` set before
  prometheus_client is imported, every worker keeps its samples in memory-mapped files in that
  folder, and /metrics, whichever worker answers it, adds up the files of all workers
  (`MultiProcessCollector`): counters and histograms summed; the in-flight gauge `livesum` (the
  live workers' values summed; a worker that stops removes its own). Not exported in this mode:
  the per-process `process_*` and `python_*` series (each worker's CPU and memory are the OS's to
  show). `serve` makes a fresh folder when the variable is unset and removes it on exit; a folder
  an operator names must be emptied before each start (prometheus_client's rule), which `serve`
  does for the `*.db` files in it.
- Reports (GET /v1/faithfulness/{id}). A lookup may reach any worker, so they keep them in one
  SQLite file (`SharedReportStore`, server/observe/reports.py): the `FAITHPROXY_REPORTS_PATH` an operator
  names, or else a file `serve` makes in a fresh folder and removes on exit (`reports_file`).
- Traces. All workers append to the one trace file: each record is a single write(2) on an O_APPEND
  descriptor (server/observe/traces.py), which a local filesystem appends whole, so lines never interleave
  (not on NFS, whose appends are not atomic: give each host its own file there).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
REPORTS_ENV = "FAITHPROXY_REPORTS_PATH"


def multiprocess() -> bool:
    """Whether this process keeps its metrics in prometheus_client's multiprocess files."""
    return bool(os.environ.get(MULTIPROC_ENV))


def scrape_registry(own: CollectorRegistry) -> CollectorRegistry:
    """What /metrics exports: every worker's samples in multiprocess mode, else this app's registry."""
    if not multiprocess():
        return own
    from prometheus_client import multiprocess as mp

    registry = CollectorRegistry()
    mp.MultiProcessCollector(registry)
    return registry


def worker_exit() -> None:
    """A worker stops: its live gauges leave the sums (its counters stay, as they must)."""
    if multiprocess():
        from prometheus_client import multiprocess as mp

        mp.mark_process_dead(os.getpid())


@contextmanager
def metrics_folder() -> Iterator[Path]:
    """The multiprocess folder for the workers about to start, set in the environment they inherit."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.db"):  # samples of an earlier run would be added to this one's
            stale.unlink()
        yield folder
        return
    folder = Path(tempfile.mkdtemp(prefix="faithproxy-metrics-"))
    os.environ[MULTIPROC_ENV] = str(folder)
    try:
        yield folder
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def reports_file(configured: str | None, keep: bool = True) -> Iterator[Path | None]:
    """The report file the workers about to start share, set in the environment they inherit: the
    configured one, else one in a fresh folder removed on exit. None (and nothing set) when reports
    are not kept (`keep` false: FAITHPROXY_REPORTS_MAX_COUNT=0)."""
    if configured or not keep:
        yield Path(configured) if configured else None
        return
    folder = Path(tempfile.mkdtemp(prefix="faithproxy-reports-"))
    os.environ[REPORTS_ENV] = str(folder / "reports.sqlite")
    try:
        yield folder / "reports.sqlite"
    finally:
        os.environ.pop(REPORTS_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)
