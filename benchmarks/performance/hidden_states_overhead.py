"""What hidden-state capture costs vLLM: tokens/s of the same requests with and without it.

    python -m faithproxy.benchmarks.performance.hidden_states_overhead --model-dir var/models/fixture-vlm --requests 40
    python -m faithproxy.benchmarks.performance.hidden_states_overhead \\
        --model-dir benchmarks/shapesworld/model/weights --data shapesworld

Starts one vLLM per configuration (CPU flags of benchmarks/tinyvlm/serve.py, float32), warms them up, then runs
`--rounds` rounds; each round sends the same greedy chat requests (each with its image) to every
configuration in turn, one at a time and `--concurrency` at a time, so that only one server works at
any moment and load from elsewhere on the machine weighs on all configurations alike. Prints completion
tokens/s (median over rounds), the median per-round ratio to `plain`, and mean latency:

- `plain`: no capture;
- `route1`: `--speculative-config extract_hidden_states` + the CPU-safe connector (every finished
  request's hidden states of `--layers` are written to a file, which this script deletes);
- `route1+probe`: route 1, and after each chain one prefill request per sentence of the reply, as the
  probe detector makes them (their time is counted against the chain's tokens);
- `route2` (`--route2`): a second server, `--runner pooling --convert embed`, answering POST /pooling
  with final-layer per-token states of the prompt + reply; timed per request next to `plain`
  generation, since it runs as a separate process.

Results depend on the machine and on what else runs on it: compare rows of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.tinyvlm.processes import supervised
from faithproxy.clients.hidden_states import HiddenStatesClient, default_layers, server_args
from faithproxy.clients.vllm import VLLMClient, assistant_text_of
from faithproxy.faithcore.segmenter import segment_text


def requests_for(data: str, n: int, model: str) -> list[dict[str, Any]]:
    if data == "fixture":
        from faithproxy.benchmarks.tinyvlm import fixture_spec as spec

        messages = [
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": spec.data_url(f.name)}},
                        {"type": "text", "text": f.question},
                    ],
                }
            ]
            for f in spec.FIXTURES
        ]
    else:
        from faithproxy.benchmarks.shapesworld.model.corpus import user_message
        from faithproxy.benchmarks.shapesworld.model.evaluate import data_url
        from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items

        messages = [[user_message(i.question.prompt, data_url(i.scene))] for i in heldout_items(n)]
    return [
        {"model": model, "messages": messages[i % len(messages)], "max_tokens": 256, "temperature": 0.0}
        for i in range(n)
    ]


async def run_load(
    base_url: str, bodies: list[dict[str, Any]], concurrency: int, probe_layers: list[int] | None
) -> dict[str, float]:
    client = VLLMClient(base_url, request_timeout_s=600)
    probe = HiddenStatesClient(client, probe_layers) if probe_layers else None
    gate = asyncio.Semaphore(concurrency)
    tokens = 0
    latencies: list[float] = []

    async def one(body: dict[str, Any]) -> None:
        nonlocal tokens
        async with gate:
            started = time.perf_counter()
            completion = await client.chat(body)
            if probe is not None:
                segments = [s for s in segment_text(assistant_text_of(completion)) if s.text]
                raws = [s.raw for s in segments]
                await probe.step_states(body["model"], body["messages"], "", raws, list(range(len(raws))))
            latencies.append(time.perf_counter() - started)
            tokens += int(completion["usage"]["completion_tokens"])

    started = time.perf_counter()
    await asyncio.gather(*(one(b) for b in bodies))
    wall = time.perf_counter() - started
    await client.aclose()
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "mean_latency_s": sum(latencies) / len(latencies),
    }


async def run_pooling(base_url: str, bodies: list[dict[str, Any]], replies: list[str]) -> dict[str, float]:
    latencies = []
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        for body, reply in zip(bodies, replies, strict=True):
            request = {
                "model": body["model"],
                "messages": [*body["messages"], {"role": "assistant", "content": reply}],
                "continue_final_message": True,
                "add_generation_prompt": False,
            }
            started = time.perf_counter()
            response = await http.post("/pooling", json=request)
            response.raise_for_status()
            latencies.append(time.perf_counter() - started)
    return {"requests": len(latencies), "mean_latency_s": sum(latencies) / len(latencies)}


@supervised()  # a signal or a failure stops every server started inside
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.performance.hidden_states_overhead", description=__doc__
    )
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--data", choices=("fixture", "shapesworld"), default="fixture")
    parser.add_argument("--requests", type=int, default=20, help="requests per load, per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--layers", type=int, nargs="+")
    parser.add_argument("--route2", action="store_true", help="also time a pooling-runner server")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))

    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    layers = args.layers or default_layers(int((config.get("text_config") or config)["num_hidden_layers"]))
    model = "bench-vlm"
    bodies = requests_for(args.data, args.requests, model)
    storage = Path(tempfile.mkdtemp(prefix="faithproxy-hs-"))
    repo = str(Path(__file__).resolve().parents[1])
    flags: dict[str, list[str]] = {"plain": [], "route1": server_args(layers, str(storage))}
    if args.route2:
        pooler = {"task": "token_embed", "tok_pooling_type": "ALL", "use_activation": False}
        flags["route2"] = ["--runner", "pooling", "--convert", "embed", "--pooler-config", json.dumps(pooler)]
    # (label, server, concurrency, probe layers): every round runs each load once, in this order, so
    # that whatever else the machine does weighs on all of them alike
    c = args.concurrency
    loads = [("plain c=1", "plain", 1, None), ("route1 c=1", "route1", 1, None),
             ("route1+probe c=1", "route1", 1, layers), (f"plain c={c}", "plain", c, None),
             (f"route1 c={c}", "route1", c, None), (f"route1+probe c={c}", "route1", c, layers)]  # fmt: skip
    servers: dict[str, Any] = {}
    per_round: dict[str, list[dict[str, float]]] = {label: [] for label, *_ in loads}
    pooling: list[dict[str, float]] = []
    try:
        for name, extra in flags.items():
            started = time.perf_counter()
            servers[name] = start_vllm(
                args.model_dir, extra_args=extra, served_model_name=model, env={"PYTHONPATH": repo}
            )
            print(f"{name}: ready in {time.perf_counter() - started:.0f}s", flush=True)
        for name in ("plain", "route1"):
            asyncio.run(run_load(servers[name].base_url, bodies[: min(4, len(bodies))], 4, None))  # warm-up
        replies = asyncio.run(_replies(servers["plain"].base_url, bodies)) if args.route2 else []
        for r in range(args.rounds):
            for label, name, concurrency, probe in loads:
                per_round[label].append(asyncio.run(run_load(servers[name].base_url, bodies, concurrency, probe)))
            if args.route2:
                pooling.append(asyncio.run(run_pooling(servers["route2"].base_url, bodies, replies)))
            done = ", ".join(f"{label} {per_round[label][-1]['tokens_per_s']:.1f}" for label, *_ in loads)
            print(f"round {r + 1}/{args.rounds} tokens/s: {done}", flush=True)
        rss = {name: _rss_mib(server.process.pid) for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(storage, ignore_errors=True)

    print(f"\n{args.requests} requests per load x {args.rounds} rounds ({args.data}, greedy), layers {layers}")
    print("RSS after the runs: " + ", ".join(f"{name} {mib:.0f} MiB" for name, mib in rss.items()))
    print(f"{'configuration':<20} {'tokens/s (median)':>18} {'vs plain (median of rounds)':>28} {'mean latency':>13}")
    for label, _name, concurrency, _ in loads:
        runs = per_round[label]
        plain = per_round[f"plain c={concurrency}"]
        ratios = [run["tokens_per_s"] / base["tokens_per_s"] for run, base in zip(runs, plain, strict=True)]
        latency = statistics.mean(run["mean_latency_s"] for run in runs)
        tps = statistics.median(run["tokens_per_s"] for run in runs)
        print(f"{label:<20} {tps:>18.0f} {statistics.median(ratios):>27.2f}x {1000 * latency:>10.0f} ms")
    if pooling:
        latency = statistics.mean(p["mean_latency_s"] for p in pooling)
        print(
            f"{'route2 /pooling c=1':<20} {'-':>18} {'-':>28} {1000 * latency:>10.0f} ms (prompt + reply, per request)"
        )
    return 0


async def _replies(base_url: str, bodies: list[dict[str, Any]]) -> list[str]:
    client = VLLMClient(base_url, request_timeout_s=600)
    out = [assistant_text_of(await client.chat(b)) for b in bodies]
    await client.aclose()
    return out


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


if __name__ == "__main__":
    sys.exit(main())
