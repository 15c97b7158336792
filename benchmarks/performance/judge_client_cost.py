"""CPU per judge call of the judge clients, measured in the calling process (issue 49, part 3).

    .venv/bin/python -m faithproxy.benchmarks.performance.judge_client_cost [--calls 500] [--json OUT]

The stand-in judge (benchmarks/standins/judge_server.py) runs in its own process, so this process's
CPU time (`time.process_time()`) is the client's alone: building the request, sending it, reading and
parsing the reply. Each client makes the same judge call (the judge detector's turn for a 12-sentence
chain, two new sentences, one inline image; the reply with its token log-probabilities, as a vLLM
judge gives them), one call after the other, interleaved call by call (ABCABC...), so drift hits
all alike; a first round of calls warms every client and connection up and is not counted.

- `openai-lean`: OpenAICompatibleJudge (clients/openai_judge.py), the OpenAI-compatible judge now;
- `openai-sdk`: the same judge over the official openai SDK, as it was built before (`SdkOpenAIJudge`
  below: the SdkJudge subclass of commit 00daac3, over today's SdkJudge);
- `anthropic-sdk`: AnthropicJudge (clients/anthropic_judge.py, the anthropic SDK), Claude's path.

Prints JSON: µs of CPU per call (mean, and the median of `--blocks` block means), wall ms per call,
the 1-minute load at the start and the end (a loaded machine inflates every figure; compare the
clients within one run, not across runs), the command, commit, date and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai

from faithproxy.benchmarks.evaluation.heldout import now
from faithproxy.benchmarks.evaluation.shapesworld_bench import git_commit
from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.clients.judge_base import (
    JudgeBackend,
    JudgeConfig,
    SdkErrorClasses,
    SdkJudge,
    TextBlock,
    TokenCounts,
    turn_text,
    usage_tokens,
)
from faithproxy.clients.judges import build_judge
from faithproxy.clients.logprobs import completion_tokens
from faithproxy.detectors.judge_prompt import JUDGE_SYSTEM_PROMPT, build_judge_turn
from faithproxy.faithcore.images import ImageRef, parse_image_url
from faithproxy.testing import chain_sentences

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
IMAGE = parse_image_url(f"data:image/png;base64,{PNG}")
SENTENCES = chain_sentences(12, 7)
CLIENTS = ("openai-lean", "openai-sdk", "anthropic-sdk")


class SdkOpenAIJudge(SdkJudge):
    """The OpenAI-compatible judge over the openai SDK, as it was before the lean client (the baseline)."""

    client_class = openai.AsyncOpenAI
    errors = SdkErrorClasses.of(openai, base=openai.OpenAIError)

    async def _send(self, system: str, user: Sequence[TextBlock], images: Sequence[ImageRef]) -> Any:
        content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": i.url}} for i in images]
        content.append({"type": "text", "text": turn_text(user)})
        extra: dict[str, Any] = {}
        if self.config.temperature is not None:
            extra["temperature"] = self.config.temperature
        if self.config.top_logprobs is not None:
            extra.update(logprobs=True, top_logprobs=self.config.top_logprobs)
        return await self._client.chat.completions.create(
            model=self.config.model,
            max_tokens=self.config.max_tokens,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": content}],
            **extra,
        )

    def _read(self, reply: Any) -> tuple[str, TokenCounts]:
        completion_tokens(reply)  # the log-probabilities were read too
        text = reply.choices[0].message.content or ""
        usage = reply.usage
        prompt = usage_tokens(usage, "prompt_tokens")
        cached = min(prompt, usage_tokens(getattr(usage, "prompt_tokens_details", None), "cached_tokens"))
        return text, TokenCounts(prompt - cached, usage_tokens(usage, "completion_tokens"), cached)


def make_clients(url: str) -> dict[str, JudgeBackend]:
    def config(backend: str, base_url: str) -> JudgeConfig:
        return JudgeConfig(name=backend, backend=backend, model="judge", base_url=base_url, api_key="k")  # type: ignore[arg-type]

    return {
        "openai-lean": build_judge(config("openai", f"{url}/v1")),
        "openai-sdk": SdkOpenAIJudge(config("openai", f"{url}/v1")),
        "anthropic-sdk": build_judge(config("anthropic", url)),
    }


async def measure(url: str, calls: int, blocks: int, warm_up: int = 20) -> dict[str, Any]:
    clients = make_clients(url)
    turn = build_judge_turn("What is in the image?", SENTENCES, already_checked=len(SENTENCES) - 2)
    cpu: dict[str, list[float]] = {name: [] for name in clients}
    wall: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for _ in range(warm_up):  # imports, connections, caches
            for judge in clients.values():
                await judge.complete(JUDGE_SYSTEM_PROMPT, turn, [IMAGE])
        assert (await clients["openai-lean"].complete(JUDGE_SYSTEM_PROMPT, turn, [IMAGE])).tokens  # logprobs came
        for _ in range(calls):
            for name, judge in clients.items():
                clock, started = time.process_time(), time.perf_counter()
                result = await judge.complete(JUDGE_SYSTEM_PROMPT, turn, [IMAGE])
                cpu[name].append(time.process_time() - clock)
                wall[name].append(time.perf_counter() - started)
                assert result.text, name
    finally:
        for judge in clients.values():
            await judge.aclose()
    size = max(1, calls // blocks)
    out = {}
    for name in clients:
        means = [statistics.fmean(cpu[name][i : i + size]) for i in range(0, calls, size)]
        out[name] = {
            "cpu_us_per_call": round(statistics.fmean(cpu[name]) * 1e6, 1),
            "cpu_us_per_call_block_median": round(statistics.median(means) * 1e6, 1),
            "wall_ms_per_call": round(statistics.fmean(wall[name]) * 1e3, 3),
        }
    return out


def run(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    load_start = Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else None
    workdir = Path(tempfile.mkdtemp(prefix="faithproxy-judge-client-"))
    oracle = workdir / "oracle.json"
    oracle.write_text(json.dumps({"unfaithful": [SENTENCES[-1]]}))
    port = processes.free_port()
    argv_judge = [sys.executable, "-m", "faithproxy.benchmarks.standins.judge_server", "--port", str(port)]
    judge = processes.spawn([*argv_judge, "--oracle", str(oracle)], workdir / "judge.log", name="judge")
    url = f"http://127.0.0.1:{port}"
    try:
        judge.wait_healthy(f"{url}/_stats", 60)
        httpx.post(f"{url}/_control", json={"flag_confidence": 0.8}, trust_env=False)  # replies carry logprobs
        clients = asyncio.run(measure(url, args.calls, args.blocks))
    finally:
        processes.stop_all([judge])
    lean, sdk = clients["openai-lean"]["cpu_us_per_call"], clients["openai-sdk"]["cpu_us_per_call"]
    return {
        "command": "python -m faithproxy.benchmarks.performance.judge_client_cost " + shlex.join(argv),
        "commit": git_commit(),
        "date": now(),
        "calls_per_client": args.calls,
        "clients": clients,
        "openai_sdk_over_lean": round(sdk / lean, 2),
        "machine": {
            "uname": " ".join(platform.uname()),
            "nproc": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": Path("/proc/loadavg").read_text().strip() if load_start else None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.performance.judge_client_cost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--calls", type=int, default=500, help="measured calls per client")
    parser.add_argument("--blocks", type=int, default=10, help="blocks of calls for the block-median figure")
    parser.add_argument("--note", help="kept in the result, e.g. 'loaded: shared with other jobs'")
    parser.add_argument("--dirty-reason", help="kept in the result: why the tree differed from its commit")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    result = run(args, argv)
    if args.note:
        result["note"] = args.note
    if args.dirty_reason:
        result["dirty_reason"] = args.dirty_reason
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
