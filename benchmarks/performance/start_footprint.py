"""What `faithproxy serve` costs before and while it serves off mode (issue 49): the time from spawn to the
first 200 on /healthz, its memory at rest (VmRSS, and VmHWM, the kernel's high-water mark), and its peak
after `--requests` streamed off requests through the fast local upstream. The targets and the client are
the overhead benchmark's (overhead_targets.py, overhead_client.py): faithproxy in off mode with no detector,
as an operator starts it.

    python -m faithproxy.benchmarks.performance.start_footprint [--starts 5 --requests 2000 \\
        --concurrency 32 --baseline SITE --json out.json]

Each variant (this code; with `--baseline SITE`, the code installed in SITE as `faithproxy-before`) is
started `--starts` times, the variants alternating, and each start is measured alone (one server at a
time, so neither's start competes with the other's). Peak RSS is the process's VmHWM once its requests
are served (RSS sampled every 50 ms during them is kept too, as overhead.py's `peak_rss_mib`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.performance import overhead_targets as targets
from faithproxy.benchmarks.performance.overhead import _PeakRSS, _run_fixed
from faithproxy.benchmarks.performance.overhead_client import make_client, request_body

GOAL_PEAK_RSS_OFF_MIB = 64.0  # issue 49: peak RSS of an off-mode server
HEALTHZ_POLL_S = 0.005
START_TIMEOUT_S = 60.0


def _status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of one process, in KiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def _mib(kib: float) -> float:
    return round(kib / 1024, 1)


async def _healthy_after(target: targets.Target, started: float) -> float:
    """Seconds from `started` (just before the spawn) to the first 200 on /healthz."""
    assert target.proc is not None
    async with httpx.AsyncClient(timeout=1.0, trust_env=False) as client:
        while True:
            if target.proc.poll() is not None:
                raise RuntimeError(f"{target.name} exited with {target.proc.returncode} before /healthz answered")
            try:
                if (await client.get(target.base_url + "/healthz")).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            if time.perf_counter() - started > START_TIMEOUT_S:
                raise RuntimeError(f"{target.name}: no 200 on /healthz within {START_TIMEOUT_S:.0f} s")
            await asyncio.sleep(HEALTHZ_POLL_S)


async def one_start(args: argparse.Namespace, workdir: Path, upstream: str, name: str, site: Path | None) -> dict:
    started = time.perf_counter()
    target = targets.start_faithproxy(workdir, upstream, 4096, name=name, site=site)
    try:
        healthz_s = await _healthy_after(target, started)
        assert target.proc is not None
        pid = target.proc.pid
        await asyncio.sleep(args.settle_s)  # what it holds at rest, once its start is over
        rest = _status_kib(pid)
        client = make_client(target.base_url, args.concurrency + 16)
        try:
            body = request_body(stream=True, chunks=args.chunks)
            watch = _PeakRSS(pid)
            results = await _run_fixed(client, body, args.chunks, args.requests, args.concurrency)
            sampled = await watch.stop()
        finally:
            await client.aclose()
        after = _status_kib(pid)
        return {
            "healthz_s": round(healthz_s, 3),
            "rest_rss_mib": _mib(rest["VmRSS"]),
            "rest_hwm_mib": _mib(rest["VmHWM"]),
            "peak_rss_mib": _mib(after["VmHWM"]),
            "sampled_peak_rss_mib": round(sampled / 2**20, 1),
            "rss_after_mib": _mib(after["VmRSS"]),
            "requests": len(results),
            "errors": sum(not r.ok for r in results),
        }
    finally:
        targets.stop(target)


def _summary(starts: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"starts": len(starts)}
    for key in ("healthz_s", "rest_rss_mib", "rest_hwm_mib", "peak_rss_mib", "sampled_peak_rss_mib", "rss_after_mib"):
        values = [s[key] for s in starts]
        out[key] = {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}
    out["errors"] = sum(s["errors"] for s in starts)
    out["each"] = starts
    return out


async def measure(
    args: argparse.Namespace, workdir: Path, upstream: str, baseline: Path | None = None
) -> dict[str, Any]:
    variants: list[tuple[str, Path | None]] = [("faithproxy", None)]
    if baseline is not None:
        variants.append(("faithproxy-before", baseline))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for i in range(args.starts):
        for name, site in variants[i % len(variants) :] + variants[: i % len(variants)]:
            print(f"start {i + 1}/{args.starts}: {name} ...", file=sys.stderr, flush=True)
            runs[name].append(await one_start(args, workdir, upstream, name, site))
    return {name: _summary(starts) for name, starts in runs.items()}


def _git(*argv: str) -> str:
    result = subprocess.run(["git", *argv], cwd=targets.ROOT, capture_output=True, text=True, check=False)
    return result.stdout.strip()


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="faithproxy-start-footprint-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    upstream = targets.start_ready(lambda: targets.start_upstream(workdir, args.chunks), "/v1/models", 30)
    try:
        baseline = Path(args.baseline).resolve() if args.baseline else None
        report = {"variants": asyncio.run(measure(args, workdir, upstream.base_url, baseline))}
    finally:
        targets.stop(upstream)
    peak = report["variants"]["faithproxy"]["peak_rss_mib"]["median"]
    report["goals"] = {
        "rule": "issue 49: peak RSS of faithproxy serve in off mode (VmHWM after the requests, median of the "
        "starts) <= target",
        "peak_rss_off_mib": {"target": GOAL_PEAK_RSS_OFF_MIB, "value": peak, "met": peak <= GOAL_PEAK_RSS_OFF_MIB},
    }
    report["command"] = " ".join(["python -m faithproxy.benchmarks.performance.start_footprint", *sys.argv[1:]])
    report["commit"] = args.commit or _git("rev-parse", "--short", "HEAD")
    report["baseline_commit"] = args.baseline_commit
    report["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    report["machine"] = {
        "uname": " ".join(platform.uname()),
        "nproc": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }
    report["config"] = {k: v for k, v in vars(args).items() if k not in ("json", "workdir")}
    return report


def render(report: dict[str, Any]) -> str:
    names = list(report["variants"])
    rows = [("", *names)]
    for key, label in (
        ("healthz_s", "spawn to first 200 on /healthz (s)"),
        ("rest_rss_mib", "RSS at rest (MiB)"),
        ("rest_hwm_mib", "VmHWM at rest (MiB)"),
        ("peak_rss_mib", "peak RSS after the requests: VmHWM (MiB)"),
        ("sampled_peak_rss_mib", "  sampled every 50 ms (MiB)"),
    ):
        cells = []
        for name in names:
            figs = report["variants"][name][key]
            cells.append(f"{figs['median']} ({figs['min']}-{figs['max']})")
        rows.append((label, *cells))
    rows.append(("errors", *(str(report["variants"][n]["errors"]) for n in names)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    goal = report["goals"]["peak_rss_off_mib"]
    lines.append(f"goal peak RSS off <= {goal['target']} MiB: {goal['value']} MiB, met: {goal['met']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.performance.start_footprint", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--starts", type=int, default=5, help="starts of each variant, alternating")
    parser.add_argument("--requests", type=int, default=2000, help="streamed off requests after each start")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--chunks", type=int, default=32, help="content chunks per answer")
    parser.add_argument("--settle-s", type=float, default=1.0, help="wait after /healthz before reading RSS at rest")
    parser.add_argument(
        "--baseline",
        metavar="SITE",
        help="also start the faithproxy installed in SITE as 'faithproxy-before' (pip install --no-deps --target "
        "SITE <checkout of the code before>)",
    )
    parser.add_argument("--baseline-commit", help="the commit installed in SITE (recorded only)")
    parser.add_argument("--commit", help="the commit of this code (recorded; default: the checkout's HEAD)")
    parser.add_argument("--workdir", help="the servers' logs (default: a temporary folder)")
    parser.add_argument("--json", help="write every figure here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = run(args)
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
