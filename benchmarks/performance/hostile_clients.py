"""Hostile clients beside real ones: p50 latency of real requests unloaded and with thousands of stalled
connections held open, side by side in one run (issue 33).

    .venv/bin/python -m faithproxy.benchmarks.performance.hostile_clients [--held 2000] [--requests 200]

A fast upstream (`python -m faithproxy.testing`) and `faithproxy serve` in front of it, each its own
process; the proxy runs as deployed (server/admission/connections.py's protocol) with its client header and body
timeouts set to --timeout-s and --max-concurrent slots, far fewer than the held connections. Phases, in
this order: unloaded; --held stalled uploads (headers and a few body bytes, then nothing); --held
slow-header connections (half send part of their headers, half nothing); unloaded again. In each,
--clients clients send --requests real requests in all, one after another per client, and the phase
prints their p50 and p95, the ratio of its p50 to the first unloaded p50 (the issue's bar: at most 2),
and the statuses (a held slot would show as 429s). After a loaded phase it waits for the proxy to close
the held connections and prints how long that took after the timeout and
faithproxy_client_connections_closed_total by reason. Figures, not assertions: the test
(tests/server/test_client_timeouts.py) checks the behaviour.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.testing.metrics import metric

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
UPLOAD = HEAD + b"content-length: %d\r\n\r\n" % len(BODY) + BODY[:10]


def raise_fd_limit(needed: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


async def real_requests(url: str, clients: int, total: int) -> tuple[list[float], Counter[int]]:
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as http:

        async def client(n: int) -> None:
            for _ in range(n):
                start = time.perf_counter()
                response = await http.post("/v1/chat/completions", content=BODY)
                latencies.append(time.perf_counter() - start)
                statuses[response.status_code] += 1

        await http.get("/healthz")  # connections warm before the clock starts
        await asyncio.gather(*(client(total // clients) for _ in range(clients)))
    return latencies, statuses


async def hold(url: str, first: list[bytes]) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = url.removeprefix("http://").split(":")
    held = []
    for start in range(0, len(first), 200):
        batch = await asyncio.gather(*(asyncio.open_connection(host, int(port)) for _ in first[start : start + 200]))
        for (_, writer), data in zip(batch, first[start : start + 200], strict=True):
            writer.write(data)
        held += batch
    return held


async def closed_by_reason(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as http:
        text = (await http.get("/metrics")).text
    reasons = ("header_timeout", "body_timeout", "idle_timeout")
    return {r: metric(text, "faithproxy_client_connections_closed_total", reason=r) for r in reasons}


async def wait_closed(held: list[tuple[asyncio.StreamReader, Any]], limit_s: float) -> float:
    """Seconds until the proxy has closed every held connection (EOF on each)."""
    start = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(reader.read() for reader, _ in held)), limit_s)
    finally:
        for _, writer in held:
            writer.close()
    return time.perf_counter() - start


def summary(name: str, latencies: list[float], statuses: Counter[int], base_p50: float | None) -> dict[str, Any]:
    p50 = statistics.median(latencies)
    p95 = statistics.quantiles(latencies, n=20)[-1] if len(latencies) > 1 else p50
    ratio = p50 / base_p50 if base_p50 else 1.0
    row = {"phase": name, "p50_ms": round(p50 * 1e3, 2), "p95_ms": round(p95 * 1e3, 2), "p50_ratio": round(ratio, 2)}
    row["statuses"] = dict(statuses)
    print(f"{name:<16} p50 {row['p50_ms']:8.2f} ms  p95 {row['p95_ms']:8.2f} ms  x{ratio:.2f}  {dict(statuses)}")
    return row


async def measure(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    await real_requests(url, args.clients, 4 * args.clients)  # warm-up, not counted
    rows = [summary("unloaded", *await real_requests(url, args.clients, args.requests), None)]
    base = rows[0]["p50_ms"] / 1e3
    half = args.held // 2
    phases = {
        "stalled_uploads": [UPLOAD] * args.held,
        "slow_headers": [HEAD] * half + [b""] * (args.held - half),
    }
    for name, first in phases.items():
        opened = time.perf_counter()
        held = await hold(url, first)
        rows.append(summary(name, *await real_requests(url, args.clients, args.requests), base))
        left = args.timeout_s - (time.perf_counter() - opened)
        took = await wait_closed(held, args.timeout_s + 60)
        rows[-1]["held"] = len(held)
        rows[-1]["open_at_end_of_phase"] = left > 0
        rows[-1]["closed_after_timeout_s"] = round(took - max(left, 0.0), 2)
        print(f"{'':<16} {len(held)} held; all closed {rows[-1]['closed_after_timeout_s']} s after the timeout")
    rows.append(summary("unloaded_again", *await real_requests(url, args.clients, args.requests), base))
    print("closed connections by reason:", await closed_by_reason(url))
    return rows


@processes.supervised()  # a signal or a failure stops every server started inside
def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="faithproxy-hostile-"))
    limit = raise_fd_limit(2 * args.held + 1024)  # the children inherit it
    print(f"open-file limit {limit}; load average {[round(x, 2) for x in os.getloadavg()]}", file=sys.stderr)
    up_port, port = processes.free_port(), processes.free_port()
    upstream = processes.start(
        [sys.executable, "-m", "faithproxy.testing", "--port", str(up_port)],
        workdir / "upstream.log",
        f"http://127.0.0.1:{up_port}/v1/models",
        name="upstream",
        timeout_s=60,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAITHPROXY_")}
    env |= {
        "FAITHPROXY_DEFAULT_DETECTOR": "none",
        "FAITHPROXY_MAX_CONCURRENT_REQUESTS": str(args.max_concurrent),
        "FAITHPROXY_CLIENT_HEADER_TIMEOUT_S": str(args.timeout_s),
        "FAITHPROXY_CLIENT_BODY_TIMEOUT_S": str(args.timeout_s),
    }
    argv = [sys.executable, "-m", "faithproxy.cli", "serve", "--upstream", f"http://127.0.0.1:{up_port}"]
    proxy = processes.start(
        [*argv, "--port", str(port), "--log-level", "warning"],
        workdir / "proxy.log",
        f"http://127.0.0.1:{port}/healthz",
        name="faithproxy",
        timeout_s=60,
        env=env,
    )
    try:
        return asyncio.run(measure(args, f"http://127.0.0.1:{port}"))
    finally:
        processes.stop_all([upstream, proxy])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", type=int, default=2000, help="stalled connections held in each loaded phase")
    parser.add_argument("--requests", type=int, default=200, help="real requests per phase")
    parser.add_argument("--clients", type=int, default=4, help="concurrent real clients")
    parser.add_argument("--max-concurrent", type=int, default=64, help="the proxy's FAITHPROXY_MAX_CONCURRENT_REQUESTS")
    parser.add_argument("--timeout-s", type=float, default=20.0, help="the proxy's client header and body timeouts")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
