"""Throughput of `faithproxy serve` with 1 and with 2 worker processes, side by side.

    .venv/bin/python -m faithproxy.benchmarks.performance.workers [--windows 3 --requests 300 \\
        --concurrency 32 --chunks 32 --idle-s 5 --baseline SITE]

The fast local upstream (`python -m faithproxy.testing`, Counted answers) is reached through two proxies, one
started with `--workers 1`, one with `--workers 2` (each in its own process tree); windows of
`--requests` streamed requests at `--concurrency` alternate between them, in `off` mode and in
`correct` mode with detector `none` (the whole correction loop, no checks: the mode whose CPU per
token is the highest without a judge). Figures: median requests per second over the windows, and the
proxy's CPU time (all its processes) per request. Every answer is checked against what the upstream
sent. Then, with no requests, each proxy's CPU per second over `--idle-s` seconds, measured over the
same seconds for all: what its processes cost while nothing happens (the supervisor's health checks,
any timer of the server's). `--baseline SITE` adds a third proxy, `--workers 2` of the faithproxy
installed in SITE (`pip install --no-deps --target SITE <checkout>`): before and after in one run.
On a machine with as many cores as the client, the upstream and the proxy together need, a second
worker helps only as far as a core is free.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.performance import overhead_targets as targets
from faithproxy.benchmarks.performance.overhead import _run_fixed
from faithproxy.benchmarks.performance.overhead_client import cpu_seconds, make_client, request_body
from faithproxy.benchmarks.tinyvlm.processes import supervised

MODES = {"off": {"x-faithproxy-mode": "off"}, "correct/none": {"x-faithproxy-mode": "correct"}}


async def measure(proxies: list[targets.Target], args: argparse.Namespace) -> dict[str, Any]:
    body = request_body(stream=True, chunks=args.chunks)
    out: dict[str, Any] = {}
    for mode, headers in MODES.items():
        clients = {}
        for proxy in proxies:
            clients[proxy.name] = make_client(proxy.base_url, args.concurrency + 8)
            clients[proxy.name].headers.update({**headers, "x-faithproxy-detector": "none"})
        rates: dict[str, list[float]] = {p.name: [] for p in proxies}
        cpu: dict[str, list[float]] = {p.name: [] for p in proxies}
        errors = dict.fromkeys(rates, 0)
        try:
            for proxy in proxies:  # warm-up: connections, lazily loaded modules in every worker
                await _run_fixed(clients[proxy.name], body, args.chunks, 4 * args.concurrency, args.concurrency)
            for w in range(args.windows):
                for proxy in proxies if w % 2 == 0 else list(reversed(proxies)):
                    assert proxy.proc is not None
                    before = cpu_seconds(proxy.proc.pid)
                    started = time.perf_counter()
                    results = await _run_fixed(clients[proxy.name], body, args.chunks, args.requests, args.concurrency)
                    elapsed = time.perf_counter() - started
                    cpu[proxy.name].append((cpu_seconds(proxy.proc.pid) - before) / args.requests)
                    rates[proxy.name].append(sum(r.ok for r in results) / elapsed)
                    errors[proxy.name] += sum(not r.ok for r in results)
        finally:
            for client in clients.values():
                await client.aclose()
        out[mode] = {
            name: {
                "rps_median": round(statistics.median(rates[name]), 1),
                "rps_windows": [round(r, 1) for r in rates[name]],
                "proxy_cpu_ms_per_request": round(statistics.median(cpu[name]) * 1000, 3),
                "errors": errors[name],
            }
            for name in rates
        }
    return out


async def idle_cpu(proxies: list[targets.Target], seconds: float) -> dict[str, float]:
    """Each proxy's CPU (all its processes) in ms per second over the same `seconds` of no requests."""
    pids = {p.name: p.proc.pid for p in proxies if p.proc is not None}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    await asyncio.sleep(seconds)
    return {name: round((cpu_seconds(pid) - before[name]) / seconds * 1000, 3) for name, pid in pids.items()}


@supervised()  # a signal or a failure stops every server started inside
def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="faithproxy-workers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    started: list[targets.Target] = []
    try:
        upstream = targets.start_ready(lambda: targets.start_upstream(workdir, args.chunks), "/v1/models", 30)
        started.append(upstream)
        proxies: list[tuple[str, Path | None, int]] = [("1 worker", None, 1), ("2 workers", None, 2)]
        if args.baseline:
            site = Path(args.baseline)
            proxies.append((f"2 workers ({site.name})", site, 2))
        for name, site_or_none, n in proxies:
            started.append(
                targets.start_ready(
                    lambda name=name, site=site_or_none, n=n: targets.start_faithproxy(
                        workdir, upstream.base_url, 4096, name=name, site=site, workers=n
                    ),
                    "/healthz",
                    60,
                )
            )
        figures = asyncio.run(measure(started[1:], args))
        idle = asyncio.run(idle_cpu(started[1:], args.idle_s)) if args.idle_s > 0 else {}
    finally:
        for target in reversed(started):
            targets.stop(target)
    return {
        "throughput": figures,
        "idle_cpu_ms_per_s": idle,
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "workdir")},
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
    }


def render(result: dict[str, Any]) -> str:
    lines = []
    for mode, by_proxy in result["throughput"].items():
        for name, f in by_proxy.items():
            lines.append(
                f"{mode:<13} {name:<10} {f['rps_median']:>7.1f} req/s (windows {f['rps_windows']}), "
                f"proxy CPU {f['proxy_cpu_ms_per_request']:.2f} ms/request, {f['errors']} errors"
            )
    for name, ms in result.get("idle_cpu_ms_per_s", {}).items():
        lines.append(f"idle          {name:<10} {ms:.3f} ms of CPU per second")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.performance.workers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300, help="streamed requests per window")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=32, help="content chunks per answer")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle CPU to measure (0: none)")
    parser.add_argument("--baseline", metavar="SITE", help="also race --workers 2 of the faithproxy installed here")
    parser.add_argument("--workdir")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    result = run(args)
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"loadavg before/after: {result['machine']['loadavg_before']} / {result['machine']['loadavg_after']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
