"""`off` mode through each door against chat's pass-through: proxy CPU per completion token, side by side.

    .venv/bin/python -m faithproxy.benchmarks.performance.door_overhead [--requests 48 --concurrency 8 \\
        --rounds 3 --json out.json]

One `faithproxy serve` process in front of real vLLM (CPU; the ShapesWorld model by default, `--model-dir`
for another, `--vllm-url` for one already running), every request with `X-Faithproxy-Mode: off`. The same
ShapesWorld questions go through each door in its own shape: chat completions (image part + text),
/v1/responses (input_image + input_text), /v1/messages (an Anthropic base64 image block + text) and
/v1/completions (the question as a raw prompt: that API takes no image), streamed and not. vLLM answers
each from its own endpoint of the same path; the proxy only admits the request and relays bytes.

A door's figure is the proxy process's CPU time over its batches divided by the completion tokens vLLM
reports (chat and completions `usage.completion_tokens`, Responses `usage.output_tokens`, Messages
`usage.output_tokens`). Batches rotate through the doors round by round, so drift hits all alike; the
ratio to chat's figure in the same run is the result. The completions door sends no image, so its
per-request share (parsing the body, settling media) is smaller than the others'.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.performance.cpu_per_token import questions
from faithproxy.benchmarks.performance.overhead_client import cpu_seconds
from faithproxy.benchmarks.tinyvlm import processes

OFF = {"x-faithproxy-mode": "off"}


def chat(model: str, question: str, image: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": question}]
    body = {"model": model, "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens}
    return {
        **body,
        "temperature": 0.0,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


def completions(model: str, question: str, image: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    body = {"model": model, "prompt": question, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
    return {**body, **({"stream_options": {"include_usage": True}} if stream else {})}


def responses(model: str, question: str, image: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    parts = [{"type": "input_image", "image_url": image}, {"type": "input_text", "text": question}]
    return {"model": model, "input": [{"role": "user", "content": parts}], "max_output_tokens": max_tokens,
            "temperature": 0.0, "stream": stream}  # fmt: skip


def messages(model: str, question: str, image: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    media, _, data = image.partition(";base64,")
    source = {"type": "base64", "media_type": media.removeprefix("data:"), "data": data}
    blocks = [{"type": "image", "source": source}, {"type": "text", "text": question}]
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": blocks}],
            "temperature": 0.0, "stream": stream}  # fmt: skip


@dataclass(frozen=True)
class Door:
    path: str
    body: Callable[[str, str, str, bool, int], dict[str, Any]]

    def tokens(self, answer: dict[str, Any]) -> int | None:
        """Completion tokens in a non-streamed answer, or in a streamed event that carries usage."""
        usage = answer.get("usage") or (answer.get("response") or {}).get("usage")
        if not isinstance(usage, dict):
            return None
        value = usage.get("completion_tokens", usage.get("output_tokens"))
        return int(value) if isinstance(value, int) else None


DOORS = [
    Door("/v1/chat/completions", chat),
    Door("/v1/completions", completions),
    Door("/v1/responses", responses),
    Door("/v1/messages", messages),
]


@dataclass
class Tally:
    cpu_s: float = 0.0
    tokens: int = 0
    requests: int = 0
    errors: list[str] = field(default_factory=list)

    def per_token_us(self) -> float | None:
        return self.cpu_s / self.tokens * 1e6 if self.tokens else None


async def one(http: httpx.AsyncClient, url: str, door: Door, body: dict[str, Any]) -> tuple[int, str | None]:
    try:
        if not body["stream"]:
            response = await http.post(url + door.path, json=body, headers=OFF)
            if response.status_code != 200:
                return 0, f"HTTP {response.status_code}: {response.text[:160]}"
            return door.tokens(response.json()) or 0, None
        tokens = 0
        async with http.stream("POST", url + door.path, json=body, headers=OFF) as response:
            if response.status_code != 200:
                await response.aread()
                return 0, f"HTTP {response.status_code}: {response.text[:160]}"
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if "error" in event and event.get("type") in (None, "error"):
                        return 0, f"error event: {str(event['error'])[:160]}"
                    # Messages reports output tokens on message_delta; the others on their last event
                    tokens = max(tokens, door.tokens(event) or 0)
        return tokens, None
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"[:160]


async def batch(
    http: httpx.AsyncClient, url: str, pid: int, door: Door, bodies: list[dict[str, Any]], concurrency: int
) -> Tally:
    pending, tally = list(bodies), Tally()

    async def worker() -> None:
        while pending:
            tokens, error = await one(http, url, door, pending.pop())
            tally.requests += 1
            tally.tokens += tokens
            if error is not None and len(tally.errors) < 3:
                tally.errors.append(error)

    before = cpu_seconds(pid)
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await asyncio.sleep(0.2)  # traces and counters are written after the last byte
    tally.cpu_s = cpu_seconds(pid) - before
    return tally


async def measure(url: str, pid: int, model: str, args: argparse.Namespace) -> dict[str, Tally]:
    asked = questions(max(args.requests, 8))
    per_round = max(1, args.requests // args.rounds)
    keys = [(door, stream) for door in DOORS for stream in (True, False)]
    tallies = {f"{door.path} {'stream' if stream else 'non-stream'}": Tally() for door, stream in keys}
    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits, trust_env=False) as http:
        for door, stream in keys:  # warm-up: lazily loaded modules, connections
            await batch(
                http, url, pid, door, [door.body(model, q, i, stream, args.max_tokens) for q, i in asked[:2]], 2
            )
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds} ...", file=sys.stderr, flush=True)
            chosen = [asked[(r * per_round + k) % len(asked)] for k in range(per_round)]
            for door, stream in keys[r % len(keys) :] + keys[: r % len(keys)]:
                bodies = [door.body(model, q, i, stream, args.max_tokens) for q, i in chosen]
                got = await batch(http, url, pid, door, bodies, args.concurrency)
                total = tallies[f"{door.path} {'stream' if stream else 'non-stream'}"]
                total.cpu_s += got.cpu_s
                total.tokens += got.tokens
                total.requests += got.requests
                total.errors += got.errors[: 3 - len(total.errors)]
    return tallies


def report(tallies: dict[str, Tally]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, t in tallies.items():
        path, kind = name.split(" ")
        chat_tally = tallies[f"/v1/chat/completions {kind}"]
        mine, base = t.per_token_us(), chat_tally.per_token_us()
        out[name] = {
            "cpu_us_per_token": None if mine is None else round(mine, 1),
            "ratio_to_chat": None if mine is None or not base else round(mine / base, 3),
            "tokens_per_request": round(t.tokens / t.requests, 1) if t.requests else None,
            "requests": t.requests,
            "errors": t.errors,
        }
    return out


def render(rows: dict[str, Any]) -> str:
    lines = [f"{'door':36} {'µs/token':>9} {'× chat':>7} {'tokens/req':>10}"]
    for name, row in rows.items():
        lines.append(
            f"{name:36} {row['cpu_us_per_token']!s:>9} {row['ratio_to_chat']!s:>7} {row['tokens_per_request']!s:>10}"
        )
        if row["errors"]:
            lines.append(f"  errors, e.g. {row['errors']}")
    return "\n".join(lines)


@processes.supervised()  # a signal or a failure stops every server started inside
def run(args: argparse.Namespace) -> dict[str, Any]:
    from faithproxy.benchmarks.performance.cpu_per_token import generator_url, start_pixel_judge, start_proxy

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="faithproxy-doors-"))
    started: list[processes.Child] = []
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        url = generator_url(args, workdir, started)
        model = httpx.get(f"{url}/v1/models", trust_env=False).json()["data"][0]["id"]
        judge, judge_url = start_pixel_judge(workdir)  # configured, never called in off mode
        proxy = start_proxy("faithproxy", url, judge_url, workdir, None)
        started += [judge, proxy.child]
        proxy.child.wait_healthy(f"{proxy.url}/readyz", 60)
        began = time.perf_counter()
        tallies = asyncio.run(measure(proxy.url, proxy.child.process.pid, model, args))
        wall = time.perf_counter() - began
    finally:
        processes.stop_all(started)
    return {
        "doors": report(tallies),
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "workdir")} | {"model": model},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before,
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()], "wall_s": round(wall, 1)},
    }  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.performance.door_overhead", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=48, help="requests per door and stream kind")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--model-dir", help="default: the ShapesWorld model (benchmarks/shapesworld/model/weights)")
    parser.add_argument("--vllm-url", help="an already running vLLM (then --model-dir is not used)")
    parser.add_argument("--workdir", help="logs (default: a temporary folder)")
    parser.add_argument("--json", help="write every figure here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run(args)
    print(render(result["doors"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
