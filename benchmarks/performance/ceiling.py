"""The most completion tokens per second one proxy process passes, per mode: a ceiling to size with.

    .venv/bin/python -m faithproxy.benchmarks.performance.ceiling [--requests 200 --concurrency 32 \\
        --chunks 200 --windows 2 --baseline SITE --json out.json]

The fast local upstream (`python -m faithproxy.testing`, Counted answers: `--chunks` content chunks of
one token each, sentences of ten, sent as fast as the socket takes them) streams through `faithproxy
serve` started with `--workers 1` and with `--workers 2`; the stand-in judge
(benchmarks/standins/judge_server.py, every sentence faithful) answers the judge modes. For each mode
(off; correct, no detector; correct, judge; detect, judge) windows of `--requests` streamed requests at
`--concurrency` alternate between the proxies. Every answer is checked against what the upstream sent.

Figures per mode and proxy: completion tokens per second through it (the median window), the proxy's
CPU per token (all its processes), and what that CPU per token means for one core: 1 s / (CPU per
token), the tokens per second one fully used worker passes. The second is the figure to plan with on
a machine whose client, upstream and judge do not share the proxy's cores (here they share two), and
`cores_for_10k` is how many proxy cores a GPU emitting 10,000 tokens/s needs at that rate.
`--delay-ms D` paces the upstream (a pause before each chunk), so that each read brings one token,
as vLLM's decode steps do, rather than as many as the socket holds: the sizing figure for a real GPU
lies between the paced and the unpaced runs.
`--baseline SITE` adds `--workers 1` of the faithproxy installed in SITE (`pip install --no-deps
--target SITE <checkout>`): before and after in one run.
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

GPU_TOKENS_PER_S = 10_000  # a GPU serving a 7B VLM, order of magnitude (issue 43)
JUDGE = "bench"
MODES: dict[str, dict[str, str]] = {
    "off": {"x-faithproxy-mode": "off"},
    "correct/none": {"x-faithproxy-mode": "correct", "x-faithproxy-detector": "none"},
    "correct/judge": {"x-faithproxy-mode": "correct", "x-faithproxy-detector": "judge"},
    "detect/judge": {"x-faithproxy-mode": "detect", "x-faithproxy-detector": "judge"},
}


def judge_env(judge_url: str) -> dict[str, str]:
    judge = {"name": JUDGE, "backend": "anthropic", "model": "judge-model", "base_url": judge_url, "api_key": "x"}
    return {"FAITHPROXY_JUDGES": json.dumps([judge])}


async def measure(proxies: list[targets.Target], args: argparse.Namespace) -> dict[str, Any]:
    body = request_body(stream=True, chunks=args.chunks, delay_ms=args.delay_ms)
    out: dict[str, Any] = {}
    for mode in args.modes.split(","):
        headers = MODES[mode]
        clients = {}
        for proxy in proxies:
            clients[proxy.name] = make_client(proxy.base_url, args.concurrency + 8)
            clients[proxy.name].headers.update(headers)
        rates: dict[str, list[float]] = {p.name: [] for p in proxies}
        cpu: dict[str, list[float]] = {p.name: [] for p in proxies}
        errors = dict.fromkeys(rates, 0)
        examples: dict[str, list[str]] = {p.name: [] for p in proxies}
        try:
            for proxy in proxies:  # warm-up: connections, lazily loaded modules in every worker
                await _run_fixed(clients[proxy.name], body, args.chunks, 2 * args.concurrency, args.concurrency)
            for w in range(args.windows):
                for proxy in proxies if w % 2 == 0 else list(reversed(proxies)):
                    assert proxy.proc is not None
                    before = cpu_seconds(proxy.proc.pid)
                    started = time.perf_counter()
                    results = await _run_fixed(clients[proxy.name], body, args.chunks, args.requests, args.concurrency)
                    elapsed = time.perf_counter() - started
                    ok = sum(r.ok for r in results)
                    tokens = ok * args.chunks
                    if tokens:
                        cpu[proxy.name].append((cpu_seconds(proxy.proc.pid) - before) / tokens)
                    rates[proxy.name].append(tokens / elapsed)
                    errors[proxy.name] += len(results) - ok
                    examples[proxy.name] += [str(r.error) for r in results if not r.ok][:2]
        finally:
            for client in clients.values():
                await client.aclose()
        out[mode] = {}
        for name in rates:
            cpu_us = round(statistics.median(cpu[name]) * 1e6, 1) if cpu[name] else None
            out[mode][name] = {
                "tokens_per_s": round(statistics.median(rates[name])),
                "tokens_per_s_windows": [round(r) for r in rates[name]],
                "cpu_us_per_token": cpu_us,
                "tokens_per_core_s": round(1e6 / cpu_us) if cpu_us else None,
                "cores_for_10k": round(GPU_TOKENS_PER_S * cpu_us / 1e6, 2) if cpu_us else None,
                "errors": errors[name],
                **({"error_examples": examples[name][:3]} if examples[name] else {}),
            }
    return out


@supervised()  # a signal or a failure stops every server started inside
def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="faithproxy-ceiling-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    started: list[targets.Target] = []
    try:
        upstream = targets.start_ready(lambda: targets.start_upstream(workdir, args.chunks), "/v1/models", 30)
        started.append(upstream)
        judge = targets.start_ready(lambda: targets.start_judge(workdir), "/_stats", 60)
        started.append(judge)
        env = judge_env(judge.base_url)
        counts = [int(n) for n in str(args.workers).split(",")]
        wanted: list[tuple[str, Path | None, int]] = [(f"{n} worker{'s' if n > 1 else ''}", None, n) for n in counts]
        if args.baseline:
            wanted.append(("1 worker (baseline)", Path(args.baseline).resolve(), 1))
        proxies = []
        for name, site, n in wanted:
            proxies.append(
                targets.start_ready(
                    lambda name=name, site=site, n=n: targets.start_faithproxy(
                        workdir, upstream.base_url, 4096, name=name, site=site, workers=n, env_extra=env
                    ),
                    "/healthz",
                    60,
                )
            )
            started.append(proxies[-1])
        started_at = time.perf_counter()
        figures = asyncio.run(measure(proxies, args))
        wall = time.perf_counter() - started_at
    finally:
        for target in reversed(started):
            targets.stop(target)
    return {
        "ceiling": figures,
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "workdir")},
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "gpu": None,
            "loadavg_before": load_before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "wall_s": round(wall, 1),
        },
    }


def render(result: dict[str, Any]) -> str:
    lines = []
    for mode, by_proxy in result["ceiling"].items():
        for name, f in by_proxy.items():
            lines.append(
                f"{mode:<14} {name:<20} {f['tokens_per_s']:>7} tokens/s  {f['cpu_us_per_token']} µs CPU/token"
                f"  = {f['tokens_per_core_s']} tokens/s per core, {f['cores_for_10k']} cores per 10k tokens/s"
                f"  ({f['errors']} errors)"
            )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.performance.ceiling", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--requests", type=int, default=200, help="streamed requests per window")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=200, help="completion tokens (content chunks) per answer")
    parser.add_argument(
        "--delay-ms", type=float, default=0.0, help="the upstream's pause before each chunk (0: as fast as it can)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--workers", default="1,2", help="worker counts to race, comma-separated")
    parser.add_argument("--baseline", metavar="SITE", help="also measure --workers 1 of the faithproxy in SITE")
    parser.add_argument("--workdir")
    parser.add_argument("--json")
    return parser


def build_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if unknown := set(args.modes.split(",")) - set(MODES):
        parser.error(f"--modes: unknown {sorted(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = build_args(argv)
    result = run(args)
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
