"""Proxy CPU per streamed token with OpenTelemetry tracing on (a collector up) against tracing off.

    .venv/bin/python -m faithproxy.benchmarks.performance.otel_overhead [--requests 200 --concurrency 8]

Two proxies (`faithproxy serve`, each its own process) in front of one fake vLLM
(`python -m faithproxy.testing --chain`: reasoning chains of 4-character tokens), `correct` mode with
detector `none` (the whole correction loop, no judge), streamed. One proxy has OTEL_EXPORTER_OTLP_ENDPOINT
pointing at a local OTLP/HTTP receiver (accepts every POST /v1/traces: the export happens for real,
protobuf encoding included), the other no OTEL_* variable. Batches alternate between the two; each
proxy's CPU time (its POSIX CPU clock) over the completion tokens its responses report is printed,
and their ratio (the issue's bound: 1.15).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.performance.overhead_client import cpu_seconds
from faithproxy.benchmarks.tinyvlm import processes

COLLECTOR = """
import sys, uvicorn
received = 0
async def app(scope, receive, send):
    global received
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    received += 1
    headers = [(b"content-type", b"application/x-protobuf")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _wait(url: str) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(300):
            try:
                await http.get(url)
                return
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


async def _batch(url: str, requests: int, concurrency: int, max_tokens: int) -> int:
    """Streams `requests` chains; returns the completion tokens the responses report."""
    gate = asyncio.Semaphore(concurrency)
    body = {
        "model": "chain-model",
        "messages": [{"role": "user", "content": "chain n=40 seed=3"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
    }
    headers = {"x-faithproxy-mode": "correct", "x-faithproxy-detector": "none"}

    async def one(http: httpx.AsyncClient) -> int:
        async with gate:
            response = await http.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        tokens = 0
        for line in response.text.split("\n\n"):
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line[6:]).get("usage") or {}
                tokens = max(tokens, int(usage.get("completion_tokens") or 0))
        return tokens

    async with httpx.AsyncClient(timeout=120) as http:
        return sum(await asyncio.gather(*(one(http) for _ in range(requests))))


async def main(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    vllm_port, collector_port, off_port, on_port = (_free_port() for _ in range(4))
    started = []
    try:
        fake = [sys.executable, "-m", "faithproxy.testing", "--port", str(vllm_port), "--chain", "--token-s", "0"]
        started.append(processes.spawn(fake, workdir / "vllm.log", name="fake vLLM"))
        collector = [sys.executable, "-c", COLLECTOR, str(collector_port)]
        started.append(processes.spawn(collector, workdir / "collector.log", name="OTLP receiver"))
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        on_env = {**base_env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector_port}"}
        if args.same:  # an A/A run: both proxies without tracing, to see the noise of this machine
            on_env = base_env
        proxies = {}
        for name, port, env in (("off", off_port, base_env), ("on", on_port, on_env)):
            upstream = f"http://127.0.0.1:{vllm_port}"
            command = [str(Path(sys.executable).with_name("faithproxy")), "serve", "--upstream", upstream]
            proxy = processes.spawn(
                [*command, "--port", str(port), "--log-level", "warning"],
                workdir / f"proxy-{name}.log",
                name=f"proxy tracing {name}",
                env=env,
            )
            started.append(proxy)
            proxies[name] = (f"http://127.0.0.1:{port}", proxy.pid)
        for url, _ in proxies.values():
            await _wait(f"{url}/healthz")
        await _wait(f"http://127.0.0.1:{collector_port}/")
        # Warm-up, not measured: each proxy's first requests, and the first export (after the batch
        # processor's 5 s delay), whose lazy imports (protobuf encoders, the HTTP session) cost once.
        for url, _ in proxies.values():
            await _batch(url, args.concurrency, args.concurrency, args.max_tokens)
        await asyncio.sleep(6.0)
        figures = {name: {"cpu_s": 0.0, "tokens": 0} for name in proxies}
        for round_ in range(args.rounds):
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for name in order:
                url, pid = proxies[name]
                before = cpu_seconds(pid)
                tokens = await _batch(url, args.requests // args.rounds, args.concurrency, args.max_tokens)
                figures[name]["cpu_s"] += cpu_seconds(pid) - before
                figures[name]["tokens"] += tokens
        await asyncio.sleep(1.0)  # the last export
    finally:
        processes.stop_all(started)
    for name, figure in figures.items():
        figure["us_per_token"] = 1e6 * figure["cpu_s"] / max(figure["tokens"], 1)
        print(
            f"tracing {name:3}: {figure['us_per_token']:7.1f} µs proxy CPU per token "
            f"({figure['tokens']} tokens, {figure['cpu_s']:.2f} s)"
        )
    ratio = figures["on"]["us_per_token"] / max(figures["off"]["us_per_token"], 1e-9)
    print(f"on / off: {ratio:.3f} (bound 1.15)")
    return {**figures, "ratio": ratio}


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per proxy")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--workdir")
    parser.add_argument("--same", action="store_true", help="trace neither proxy (the noise between them)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or "var/otel_overhead")
    workdir.mkdir(parents=True, exist_ok=True)
    asyncio.run(main(args, workdir))


if __name__ == "__main__":
    cli()
