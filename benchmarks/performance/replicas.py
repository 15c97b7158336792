"""Verified throughput with two vLLM replicas behind vLLM's router against one replica direct, and the
prefill tokens the routing key's affinity saves, in one run.

    .venv/bin/python -m faithproxy.benchmarks.performance.replicas [--requests 24 --concurrency 8]

Starts two vLLM replicas of the fixture model (benchmarks/performance/replica_stack.py), a consistent-hash
and a round-robin `vllm-router` in front of them, and the local judge; faithproxy runs in this process.
Every request is a verified request (correct mode, the local judge) about a fixture scene whose chain
has a planted wrong step, so it is rewritten and continued; every request's image is fresh (one pixel),
so prefix-cache hits come from the request's own earlier calls.

Figures (JSON on stdout):
- throughput: `--requests` at `--concurrency` through the consistent-hash router (two replicas) and
  straight to replica 0 (one), requests per second and their ratio. On a machine whose cores the
  replicas share (two here) the ratio says nothing about a GPU deployment: two CPU replicas split the
  same cores.
- affinity: the same requests through the consistent-hash router (every call of a request on one
  replica) and the round-robin router (calls spread); prompt tokens, prefix-cache hits (tokens vLLM did
  not prefill again) and hit rate from each replica's /metrics, summed. `prefill_tokens_saved` is the
  difference in cache hits: the prefill the key's affinity saved over round robin.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.performance import replica_stack as rs
from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.benchmarks.tinyvlm.processes import supervised
from faithproxy.benchmarks.tinyvlm.serve import VLLMServer
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import running_app, threaded_app

DEFAULT_MODEL_DIR = rs.REPO / "var" / "models" / "fixture-vlm"


def proxy_settings(upstream: str, judge_url: str) -> Settings:
    judge = JudgeConfig(
        name="local", backend="anthropic", model="judge", base_url=judge_url, api_key="k", max_retries=0
    )  # type: ignore[arg-type]
    return Settings(upstream_url=upstream, judges=[judge], default_judge="local", regeneration_temperature=0.0)


async def run_window(
    upstream: str, judge_url: str, replicas: list[VLLMServer], requests: int, concurrency: int, nonce: int
) -> dict[str, Any]:
    """`requests` verified requests at `concurrency` through a proxy in front of `upstream`."""
    gate = asyncio.Semaphore(concurrency)
    failed = 0

    async def one(http: httpx.AsyncClient, url: str, i: int) -> None:
        nonlocal failed
        body = rs.scene_request(rs.SCENES[i % len(rs.SCENES)], nonce + i)
        async with gate:
            response = await http.post(f"{url}/v1/chat/completions", json=body)
        if response.status_code != 200 or '"error"' in response.text:
            failed += 1

    before = await rs.read_counters(replicas)
    async with running_app(create_app(proxy_settings(upstream, judge_url))) as url:
        async with httpx.AsyncClient(timeout=600) as http:
            started = time.perf_counter()
            await asyncio.gather(*(one(http, url, i) for i in range(requests)))
            elapsed = time.perf_counter() - started
    after = await rs.read_counters(replicas)
    spent = [a - b for a, b in zip(after, before, strict=True)]
    total = spent[0] + spent[1]
    return {
        "requests": requests,
        "failed": failed,
        "seconds": round(elapsed, 2),
        "requests_per_s": round(requests / elapsed, 3),
        "calls_per_replica": [c.calls for c in spent],
        "prompt_tokens": total.prompt_tokens,
        "cache_hits": total.cache_hits,
        "hit_rate": round(rs.hit_rate(total), 3),
    }


async def measure(
    args: argparse.Namespace, replicas: list[VLLMServer], routers: dict[str, rs.Router]
) -> dict[str, Any]:
    judge_app = create_judge_app(spec.oracle_json())
    nonce = int(time.time()) % 100_000 * 1000
    with threaded_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url:
        windows = {}
        for i, (name, upstream) in enumerate(
            [
                ("two_replicas_consistent_hash", routers["consistent_hash"].base_url),
                ("one_replica_direct", replicas[0].base_url),
                ("two_replicas_round_robin", routers["round_robin"].base_url),
            ]
        ):
            windows[name] = await run_window(
                upstream, judge_url, replicas, args.requests, args.concurrency, nonce + i * args.requests
            )
    ch, one, rr = (
        windows[k] for k in ("two_replicas_consistent_hash", "one_replica_direct", "two_replicas_round_robin")
    )
    return {
        "windows": windows,
        "throughput_ratio_two_over_one": round(ch["requests_per_s"] / one["requests_per_s"], 3),
        "prefill_tokens_saved_by_affinity": ch["cache_hits"] - rr["cache_hits"],
        "prefill_tokens_saved_per_request": round((ch["cache_hits"] - rr["cache_hits"]) / args.requests, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="replicas-bench-"))
    with supervised():
        started = time.perf_counter()
        replicas = rs.start_replicas(args.model_dir, 2, logs)
        start_s = time.perf_counter() - started
        routers: dict[str, rs.Router] = {}
        try:
            for policy in ("consistent_hash", "round_robin"):
                routers[policy] = rs.start_router([r.base_url for r in replicas], policy, logs / f"{policy}.log")
            figures = asyncio.run(measure(args, replicas, routers))
        finally:
            for router in routers.values():
                router.stop()
            for replica in replicas:
                replica.stop()
    figures["replicas_start_s"] = round(start_s, 1)
    json.dump(figures, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
