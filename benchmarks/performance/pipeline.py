"""Does verification serialize decoding? Wall time of verified chains against unverified ones.

Real vLLM (CPU) serves the fixture model; a local judge answers after a fixed latency set equal to the
measured decode time of one step; two proxy processes run, `faithproxy serve` (pipelined: decoding
runs ahead while a step is checked) and the same command with FAITHPROXY_SEQUENTIAL_CHECKS=true (the
machine's sequential rule: one step per upstream request, checked before the next is decoded).
Configurations are interleaved request by request, so machine noise hits them alike; figures are
ratios to the unverified proxy (X-Faithproxy-Mode: off) measured in the same run.

    .venv/bin/python -m faithproxy.benchmarks.performance.pipeline --rounds 10
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.testing import running_app

CLEAN = ("green_circle", "yellow_triangle")  # chains with no unfaithful step
PLANTED = ("red_circle", "square_and_circle")  # one planted step each, fixed in one try


@dataclass
class Result:
    """One request: wall time to the last byte, or the error that replaced it."""

    config: str
    fixture: str
    wall_s: float = 0.0
    steps: int = 0
    error: str | None = None


@dataclass
class Config:
    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)


def _body(model: str, fixture: str) -> dict[str, Any]:
    from faithproxy.benchmarks.tinyvlm import fixture_spec as spec

    return {
        "model": model,
        "stream": True,
        "temperature": 0.0,
        "max_tokens": 200,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": spec.data_url(fixture)}},
                    {"type": "text", "text": spec.get(fixture).question},
                ],
            }
        ],
    }


async def timed_stream(http: httpx.AsyncClient, config: Config, model: str, fixture: str) -> Result:
    result = Result(config.name, fixture)
    started = time.perf_counter()
    try:
        async with http.stream(
            "POST", f"{config.url}/v1/chat/completions", json=_body(model, fixture), headers=config.headers
        ) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}"
                return result
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"step"' in line:
                    result.steps += 1
                if '"error"' in line and line.startswith("data: "):
                    result.error = line[:200]
    except httpx.HTTPError as exc:
        result.error = type(exc).__name__
    result.wall_s = time.perf_counter() - started
    return result


async def step_decode_time(http: httpx.AsyncClient, vllm_url: str, model: str) -> float:
    """Median time vLLM takes to decode one step of a clean chain (first to last text chunk / steps)."""
    from faithproxy.faithcore.segmenter import segment_text

    samples = []
    for fixture in CLEAN * 3:
        first = last = None
        text = ""
        async with http.stream("POST", f"{vllm_url}/v1/chat/completions", json=_body(model, fixture)) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"]
                    if delta and delta[0]["delta"].get("content"):
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        text += delta[0]["delta"]["content"]
        steps = len([s for s in segment_text(text) if s.text])
        if first is not None and last is not None and steps:
            samples.append((last - first) / steps)
    return statistics.median(samples)


def _serve(name: str, port: int, upstream: str, judge_url: str, pipelined: bool, log: Path) -> processes.Child:
    judges = [
        {
            "name": "bench",
            "backend": "anthropic",
            "model": "bench",
            "base_url": judge_url,
            "api_key": "x",
            "timeout_s": 30,
        }
    ]
    env = {
        **os.environ,
        "FAITHPROXY_JUDGES": json.dumps(judges),
        "FAITHPROXY_REGENERATION_TEMPERATURE": "0",
        "FAITHPROXY_SEQUENTIAL_CHECKS": "false" if pipelined else "true",
    }
    argv = [sys.executable, "-m", "faithproxy.cli", "serve", "--upstream", upstream, "--port", str(port)]
    return processes.spawn([*argv, "--log-level", "warning"], log, name=name, env=env)


async def _wait_ready(child: processes.Child, url: str, wait_s: float = 60) -> None:
    # The wait polls with blocking calls: off the event loop, which serves the in-process judge meanwhile.
    await asyncio.to_thread(child.wait_healthy, f"{url}/readyz", wait_s)


async def run(vllm_url: str, model: str, rounds: int, judge_latency: float | None) -> dict[str, Any]:
    from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
    from faithproxy.benchmarks.tinyvlm.processes import free_port

    judge_app = create_judge_app(spec.oracle_json())
    logs = Path(tempfile.mkdtemp(prefix="fp-bench-"))
    async with (
        running_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url,
        httpx.AsyncClient(timeout=120) as http,
    ):
        step_s = await step_decode_time(http, vllm_url, model)
        judge_app.state.judge.latency_s = step_s if judge_latency is None else judge_latency
        ports = free_port(), free_port()
        procs: list[processes.Child] = []
        try:
            procs.append(_serve("pipelined faithproxy", ports[0], vllm_url, judge_url, True, logs / "pipelined.log"))
            procs.append(_serve("sequential faithproxy", ports[1], vllm_url, judge_url, False, logs / "sequential.log"))
            for proc, port in zip(procs, ports, strict=True):
                await _wait_ready(proc, f"http://127.0.0.1:{port}")
            pipelined, sequential = (f"http://127.0.0.1:{p}" for p in ports)
            configs = [
                Config("unverified (mode off)", pipelined, {"X-Faithproxy-Mode": "off"}),
                Config("verified, pipelined", pipelined, {"X-Faithproxy-Detector": "judge"}),
                Config("verified, sequential", sequential, {"X-Faithproxy-Detector": "judge"}),
            ]
            results: list[Result] = []
            for fixture in CLEAN + PLANTED:  # warm-up: caches, connections
                for config in configs:
                    await timed_stream(http, config, model, fixture)
            for _ in range(rounds):
                for fixture in CLEAN + PLANTED:
                    for config in configs:
                        results.append(await timed_stream(http, config, model, fixture))
        finally:
            processes.stop_all(procs)
    return report(results, step_s, judge_app.state.judge.latency_s, rounds)


def report(results: list[Result], step_s: float, judge_s: float, rounds: int) -> dict[str, Any]:
    errors = [r for r in results if r.error]
    out: dict[str, Any] = {
        "step_decode_s": step_s,
        "judge_latency_s": judge_s,
        "rounds": rounds,
        "errors": len(errors),
        "median_wall_s": {},
        "ratio_to_unverified": {},
    }
    for group, fixtures in (("clean", CLEAN), ("planted", PLANTED)):
        medians = {}
        for config in ("unverified (mode off)", "verified, pipelined", "verified, sequential"):
            walls = [r.wall_s for r in results if r.config == config and r.fixture in fixtures and not r.error]
            medians[config] = statistics.median(walls) if walls else float("nan")
        base = medians["unverified (mode off)"]
        out["median_wall_s"][group] = medians
        out["ratio_to_unverified"][group] = {k: v / base for k, v in medians.items()}
    return out


@processes.supervised()  # a signal or a failure stops every server started inside
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-url", help="an already running vLLM serving the fixture model")
    parser.add_argument("--model-dir", default="var/models/fixture-vlm")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--judge-latency-s", type=float, help="default: the measured step decode time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    server = None
    url = args.vllm_url
    if url is None:
        from faithproxy.benchmarks.tinyvlm.serve import start_vllm

        server = start_vllm(args.model_dir)
        url = server.base_url
    try:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        result = asyncio.run(run(url, model, args.rounds, args.judge_latency_s))
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"step decode time {result['step_decode_s'] * 1000:.1f} ms, judge latency "
        f"{result['judge_latency_s'] * 1000:.1f} ms, {args.rounds} rounds, errors {result['errors']}"
    )
    for group in ("clean", "planted"):
        print(f"\n{group} chains        median wall   ratio to unverified")
        for config, wall in result["median_wall_s"][group].items():
            print(f"  {config:<24} {wall * 1000:8.1f} ms   {result['ratio_to_unverified'][group][config]:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
