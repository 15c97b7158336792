"""What the judge costs per checked step, before and after the incremental protocol, and what it costs
in wall time on long chains.

Tokens (always): chains of 20, 50 and 150 sentences (faithproxy/testing/chains.py writes
them), checked one new sentence per judge call, the most calls a chain can cost.
- BEFORE: the old protocol (judge_protocol_before.py: the whole chain, every sentence typed, the image
  described on every call), counted on its prompts and the replies an obedient judge wrote to them; for
  the Anthropic path nothing was cached (it sent no cache_control), for a vLLM judge the prefix cache is
  applied to the same prompts.
- AFTER: the real JudgeDetector through the real SDKs against the local judge server (both wire
  protocols), which counts tokens and prompt caching the way each vendor does (judge_server.py).
Tokens are counted at 4 characters each and 800 per image, in both columns alike.

Wall time (--wall): a real `faithproxy serve` process in front of the scripted chain upstream (one
token every --token-s) with the local judge whose latency follows a VLM's token timing: --judge-fixed-s
plus --judge-prefill-s per uncached prompt token plus --judge-decode-s per output token (default: the
generator's --token-s, i.e. judge decode speed equal to the generator's). Verified (correct mode, judge)
over unverified (X-Faithproxy-Mode: off), interleaved request by request; chains that need no
correction, then chains with one planted unfaithful sentence (regenerated once) separately. A model of
the same pipeline (one judge call at a time, batches of what finished meanwhile) gives the BEFORE
protocol's wall time, which is too slow to measure at 150 sentences.

    .venv/bin/python -m faithproxy.benchmarks.performance.judge_cost
    .venv/bin/python -m faithproxy.benchmarks.performance.judge_cost --wall [--rounds 2] [--json]
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.performance import judge_protocol_before as before_protocol
from faithproxy.benchmarks.standins.judge_requests import openai_parts
from faithproxy.benchmarks.standins.judge_server import create_app, running_judge_server
from faithproxy.benchmarks.standins.oracle import Oracle
from faithproxy.benchmarks.standins.prompt_cache import IMAGE_TOKENS, PromptCache, vllm_usage
from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.clients.judges import JudgeConfig, build_judge
from faithproxy.detectors.judge import JudgeDetector
from faithproxy.detectors.judge_prompt import JUDGE_SYSTEM_PROMPT
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.images import parse_image_url
from faithproxy.faithcore.types import Step, StepKind
from faithproxy.testing import Chain, ChainSpec, FakeUpstream, chain_sentences, planted_sentence, running_app

LENGTHS = (20, 50, 150)
SEED = 7
DESCRIPTION = "A street scene: a red car parked left of a blue truck, a dog on the pavement and a shop sign."
QUESTION = ChainSpec(0, SEED).question
# A small PNG as the request's image: what matters is that each call carries one (counted IMAGE_TOKENS).
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
IMAGE_URL = f"data:image/png;base64,{PNG}"


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def oracle(planted: list[str] = ()) -> Oracle:  # type: ignore[assignment]
    return Oracle.of(list(planted), description=DESCRIPTION)


# ---------------------------------------------------------------------------------------------- tokens


@dataclass
class Bill:
    """One chain's judge bill, per call."""

    protocol: str
    version: str  # before | after
    n: int
    fresh: list[int]  # prompt tokens not served from cache (cache writes included)
    cached: list[int]
    output: list[int]
    descriptions: int

    def summary(self) -> dict[str, Any]:
        calls = len(self.fresh)
        return {
            "protocol": self.protocol,
            "version": self.version,
            "sentences": self.n,
            "calls_per_checked_sentence": calls / self.n,
            "uncached_input_per_call": sum(self.fresh) / calls,
            "uncached_input_last_call": self.fresh[-1],
            "uncached_input_third_call": self.fresh[min(2, calls - 1)],
            "cached_input_per_call": sum(self.cached) / calls,
            "output_per_checked_sentence": sum(self.output) / self.n,
            "output_per_call_after_the_first": statistics.mean(self.output[1:]) if calls > 1 else self.output[0],
            "input_total": sum(self.fresh) + sum(self.cached),
            "output_total": sum(self.output),
            "descriptions": self.descriptions,
        }


def before_bills(n: int) -> list[Bill]:
    """The old protocol's bill: Anthropic without caching, and a vLLM judge with its prefix cache."""
    sentences = chain_sentences(n, SEED)
    truth = oracle()
    kinds = [truth.kind(s) for s in sentences]
    cache = PromptCache()
    anthropic = Bill("anthropic", "before", n, [], [], [], 0)
    vllm = Bill("openai", "before", n, [], [], [], 0)
    for i in range(1, n + 1):
        hint = DESCRIPTION if i > 1 else None
        user = before_protocol.build_prompt(QUESTION, sentences[:i], already_checked=i - 1, image_hint=hint)
        out = _tokens(before_protocol.reply(DESCRIPTION, kinds[:i], [False] * i, sentences[:i], i - 1))
        prompt = _tokens(before_protocol.SYSTEM_PROMPT) + IMAGE_TOKENS + _tokens(user)
        anthropic.fresh.append(prompt)
        anthropic.cached.append(0)
        anthropic.output.append(out)
        body = {
            "messages": [
                {"role": "system", "content": before_protocol.SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": IMAGE_URL}}, {"type": "text", "text": user}],
                },
            ]
        }
        usage = vllm_usage(cache, openai_parts(body, IMAGE_TOKENS).pieces, out)
        vllm.fresh.append(usage.input_tokens)
        vllm.cached.append(usage.cached)
        vllm.output.append(out)
    anthropic.descriptions = vllm.descriptions = n  # described again on every call
    return [anthropic, vllm]


async def after_bill(protocol: str, n: int) -> Bill:
    """The incremental protocol, measured: the detector, the SDK and the judge server, one call per new
    sentence, the accepted chain growing as a request's does."""
    app = create_app(oracle())
    async with running_judge_server(app) as url:
        base = url if protocol == "anthropic" else f"{url}/v1"
        config = JudgeConfig(name=protocol, backend=protocol, model="judge", base_url=base, api_key="k")  # type: ignore[arg-type]
        detector = JudgeDetector({protocol: build_judge(config)}, protocol)
        ctx = RequestView("bench", "m", [], QUESTION, (parse_image_url(IMAGE_URL),))
        bill = Bill(protocol, "after", n, [], [], [], 0)
        try:
            for i, text in enumerate(chain_sentences(n, SEED)):
                step = Step(index=i, text=text, raw=text, kind=StepKind.PERCEPTION)
                before = ctx.judge_state.usage.as_dict()
                await detector.check(ctx, [step])
                after = ctx.judge_state.usage.as_dict()
                bill.fresh.append(
                    after["input_tokens"] - before["input_tokens"]
                    + after["cache_creation_tokens"] - before["cache_creation_tokens"]
                )  # fmt: skip
                bill.cached.append(after["cached_input_tokens"] - before["cached_input_tokens"])
                bill.output.append(after["output_tokens"] - before["output_tokens"])
                ctx = ctx.with_accepted([*ctx.accepted, step])
        finally:
            await detector.aclose()
        bill.descriptions = ctx.judge_state.descriptions
        assert app.state.judge.descriptions == bill.descriptions  # what the judge wrote, not what we think
        return bill


async def token_figures(lengths: tuple[int, ...] = LENGTHS) -> list[dict[str, Any]]:
    rows = []
    for n in lengths:
        rows += [b.summary() for b in before_bills(n)]
        for protocol in ("anthropic", "openai"):
            rows.append((await after_bill(protocol, n)).summary())
    return rows


def reply_format_figures(n: int = 150) -> dict[str, Any]:
    """Output tokens per checked sentence of the text reply format against the most compact JSON a
    guided (json_schema) reply could take, for the same verdicts; counted at 4 characters a token and,
    where the fixture model is built, by its byte-level BPE tokenizer (a real tokenizer, if a small one)."""
    sentences = chain_sentences(n, SEED)
    truth = oracle()
    texts, jsons = [], []
    for i in range(1, n + 1):
        first = i == 1
        texts.append(truth.reply(sentences[:i], i - 1, describe=first))
        record: dict[str, Any] = {"description": DESCRIPTION} if first else {}
        record |= {"types": {str(i): truth.kind(sentences[i - 1]).name}, "faithfulness": "FAITHFUL"}
        record["first_unfaithful"] = None
        jsons.append(json.dumps(record, separators=(",", ":")))
    out: dict[str, Any] = {
        "chars/4": {"text": sum(map(_tokens, texts)) / n, "json": sum(map(_tokens, jsons)) / n},
    }
    tokenizer = Path(__file__).resolve().parents[2] / "var" / "models" / "fixture-vlm" / "tokenizer.json"
    if tokenizer.exists():
        from tokenizers import Tokenizer

        bpe = Tokenizer.from_file(str(tokenizer))
        count = lambda t: len(bpe.encode(t).ids)  # noqa: E731
        out["fixture BPE"] = {"text": sum(map(count, texts)) / n, "json": sum(map(count, jsons)) / n}
    return out


# ----------------------------------------------------------------------------------------- wall time


@dataclass
class Timing:
    token_s: float = 0.02
    judge_fixed_s: float = 0.15
    judge_prefill_s: float = 0.00025
    judge_decode_s: float | None = None  # None: the generator's token_s

    @property
    def decode_s(self) -> float:
        return self.token_s if self.judge_decode_s is None else self.judge_decode_s


def modelled_wall(n: int, timing: Timing, version: str, max_batch: int = 16) -> tuple[float, float]:
    """(unverified, verified) seconds of an n-sentence clean chain under the pipelined loop: sentences
    finish every `sentence_s`; one judge call at a time takes every finished unchecked sentence (at most
    max_batch); the client's last byte follows the last check. Call latency from the protocol's tokens."""
    sentences = chain_sentences(n, SEED)
    truth = oracle()
    kinds = [truth.kind(s) for s in sentences]
    finished = [0.0] * n
    clock = 0.0
    for i, text in enumerate(sentences):
        clock += timing.token_s * (len(text) + 1) / 4
        finished[i] = clock
    unverified = clock
    cache = PromptCache()
    done, free_at = 0, 0.0
    while done < n:
        start = max(free_at, finished[done])
        batch = 1
        while done + batch < n and batch < max_batch and finished[done + batch] <= start:
            batch += 1
        chain = sentences[: done + batch]
        if version == "before":
            user = before_protocol.build_prompt(
                QUESTION, chain, already_checked=done, image_hint=DESCRIPTION if done else None
            )
            out = _tokens(before_protocol.reply(DESCRIPTION, kinds[: done + batch], [False] * len(chain), chain, done))
            fresh = _tokens(before_protocol.SYSTEM_PROMPT) + IMAGE_TOKENS + _tokens(user)
        else:
            from faithproxy.detectors.judge_prompt import build_judge_prompt

            user = build_judge_prompt(
                QUESTION,
                chain,
                already_checked=done,
                description=DESCRIPTION if done else None,
                ask_description=not done,
            )
            reply = truth.reply(chain, done, describe=not done)
            out = _tokens(reply)
            body = {
                "messages": [
                    {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                            {"type": "text", "text": user},
                        ],
                    },
                ]
            }
            fresh = vllm_usage(cache, openai_parts(body, IMAGE_TOKENS).pieces, out).input_tokens
        free_at = start + timing.judge_fixed_s + timing.judge_prefill_s * fresh + timing.decode_s * out
        done += batch
    return unverified, max(free_at, unverified)


async def _stream(
    http: httpx.AsyncClient, url: str, spec: ChainSpec, headers: dict[str, str]
) -> tuple[float, str | None]:
    body = {
        "model": Chain.model,
        "stream": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                    {"type": "text", "text": spec.question},
                ],
            }
        ],
    }
    started = time.perf_counter()
    error = None
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            return time.perf_counter() - started, f"HTTP {response.status_code}"
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"error"' in line:
                error = line[:300]
    return time.perf_counter() - started, error


async def wall_figures(
    timing: Timing, rounds: int, judge_backend: str, lengths: tuple[int, ...] = LENGTHS
) -> dict[str, Any]:
    specs = {n: (ChainSpec(n, SEED), ChainSpec(n, SEED, planted=n // 2)) for n in lengths}
    planted = [planted_sentence(n, SEED, n // 2) for n in lengths]
    judge_app = create_app(
        oracle(planted),
        timing.judge_fixed_s,
        input_token_s=timing.judge_prefill_s,
        output_token_s=timing.decode_s,
    )
    upstream_app = FakeUpstream(Chain(token_s=timing.token_s), record=False)
    logs = Path(tempfile.mkdtemp(prefix="fp-judge-cost-"))
    results: dict[str, list[float]] = {}
    errors: list[str] = []
    async with (
        running_app(upstream_app) as upstream_url,
        running_judge_server(judge_app) as judge_url,
        httpx.AsyncClient(timeout=600) as http,
    ):
        port = processes.free_port()
        judges = [
            {
                "name": "bench",
                "backend": judge_backend,
                "model": "judge",
                "base_url": judge_url if judge_backend == "anthropic" else f"{judge_url}/v1",
                "api_key": "x",
                "timeout_s": 120,
                "max_retries": 0,
            }
        ]
        env = {**os.environ, "FAITHPROXY_JUDGES": json.dumps(judges), "FAITHPROXY_REGENERATION_TEMPERATURE": "0"}
        argv = [sys.executable, "-m", "faithproxy.cli", "serve", "--upstream", upstream_url, "--port", str(port)]
        proxy = processes.spawn([*argv, "--log-level", "warning"], logs / "proxy.log", name="faithproxy", env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            await asyncio.to_thread(proxy.wait_healthy, f"{url}/readyz", 60)
            configs = {"verified": {"X-Faithproxy-Detector": "judge"}, "unverified": {"X-Faithproxy-Mode": "off"}}
            await _stream(http, url, ChainSpec(5, SEED), configs["verified"])  # warm-up
            for _ in range(rounds):
                for n in lengths:
                    for kind, spec in zip(("clean", "planted"), specs[n], strict=True):
                        for config, headers in configs.items():
                            wall, error = await _stream(http, url, spec, headers)
                            if error:
                                errors.append(f"{kind} {n} {config}: {error}")
                            results.setdefault(f"{kind}/{n}/{config}", []).append(wall)
        finally:
            processes.stop_all([proxy])
    out: dict[str, Any] = {"errors": errors, "measured": {}, "modelled": {}}
    for kind in ("clean", "planted"):
        for n in lengths:
            verified = statistics.median(results[f"{kind}/{n}/verified"])
            unverified = statistics.median(results[f"{kind}/{n}/unverified"])
            out["measured"][f"{kind}/{n}"] = {
                "unverified_s": unverified,
                "verified_s": verified,
                "ratio": verified / unverified,
            }
    for version in ("before", "after"):
        for n in lengths:
            plain, checked = modelled_wall(n, timing, version)
            out["modelled"][f"{version}/{n}"] = {"unverified_s": plain, "verified_s": checked, "ratio": checked / plain}
    return out


# ---------------------------------------------------------------------------------------------- main


def _print_tokens(rows: list[dict[str, Any]]) -> None:
    print("judge tokens, one new sentence per call (4 characters a token, 800 an image)")
    header = (
        f"{'protocol':<10}{'version':<8}{'n':>5}{'calls/sent':>11}{'uncached in/call':>17}{'3rd→last call':>16}"
        f"{'cached in/call':>15}{'out/sentence':>13}{'descriptions':>13}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['protocol']:<10}{r['version']:<8}{r['sentences']:>5}{r['calls_per_checked_sentence']:>11.2f}"
            f"{r['uncached_input_per_call']:>17.0f}{r['uncached_input_third_call']:>8}→{r['uncached_input_last_call']:<7}"
            f"{r['cached_input_per_call']:>15.0f}{r['output_per_checked_sentence']:>13.1f}{r['descriptions']:>13}"
        )


def _print_wall(wall: dict[str, Any], timing: Timing, backend: str) -> None:
    print(
        f"\nwall time, verified / unverified ({backend} judge): generator {timing.token_s * 1000:.0f} ms/token; judge "
        f"{timing.judge_fixed_s * 1000:.0f} ms + {timing.judge_prefill_s * 1000:.2f} ms per uncached input token + "
        f"{timing.decode_s * 1000:.0f} ms per output token"
    )
    for key, row in wall["measured"].items():
        print(f"  measured {key:<14} {row['unverified_s']:7.2f} s → {row['verified_s']:7.2f} s   {row['ratio']:.3f}x")
    for key, row in wall["modelled"].items():
        print(f"  modelled {key:<14} {row['unverified_s']:7.2f} s → {row['verified_s']:7.2f} s   {row['ratio']:.3f}x")
    for error in wall["errors"]:
        print(f"  error: {error}")


@processes.supervised()  # a signal or a failure stops the proxy process started inside
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wall", action="store_true", help="also measure wall time through a real proxy")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--token-s", type=float, default=0.02, help="generator: seconds per token")
    parser.add_argument("--judge-fixed-s", type=float, default=0.15)
    parser.add_argument("--judge-prefill-s", type=float, default=0.00025, help="per uncached prompt token")
    parser.add_argument("--judge-decode-s", type=float, help="per output token (default: --token-s)")
    parser.add_argument("--judge-backend", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="chain lengths (sentences)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    lengths = tuple(args.lengths)
    timing = Timing(args.token_s, args.judge_fixed_s, args.judge_prefill_s, args.judge_decode_s)
    out: dict[str, Any] = {"tokens": asyncio.run(token_figures(lengths)), "reply_formats": reply_format_figures()}
    if args.wall:
        out["wall"] = asyncio.run(wall_figures(timing, args.rounds, args.judge_backend, lengths))
        out["timing"] = {**timing.__dict__, "judge_decode_s": timing.decode_s, "judge_backend": args.judge_backend}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    _print_tokens(out["tokens"])
    print("\noutput tokens per checked sentence, 150 sentences, by reply format")
    for counter, row in out["reply_formats"].items():
        print(f"  {counter:<12} text {row['text']:6.1f}   json {row['json']:6.1f}")
    if args.wall:
        _print_wall(out["wall"], timing, args.judge_backend)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
