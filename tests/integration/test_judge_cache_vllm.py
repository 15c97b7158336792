"""The judge's prompt caching against real servers.

- OpenAI-compatible path: the judge is a VLM served by REAL vLLM (the shared fixture-model server,
  started with --enable-prefix-caching; the fixture model stands in for a judge VLM). The calls of one
  request share their prefix (system, image, question, accepted chain), and vLLM's own /metrics
  prefix-cache counters show the later calls served from cache. The tiny model cannot write the judge
  format, so each call ends in an `unparseable` DetectorError: the prompt and its caching are what is
  under test, and the request's bill is recorded before the reply is parsed.
- Anthropic path: faithproxy in front of real vLLM with a judge behind the Messages API (the real
  anthropic SDK against the local judge server, which honours cache_control): breakpoints go out,
  and the cache read and write tokens come back into the request's summary, trace and metrics.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.clients.judges import JudgeConfig, build_judge
from faithproxy.detectors.judge import JudgeDetector
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.errors import DetectorError
from faithproxy.faithcore.images import parse_image_url
from faithproxy.faithcore.types import Step, StepKind
from faithproxy.server.app import create_app
from faithproxy.testing import metric, running_app
from tests.support import local_judge_settings, proxy_metrics, read_traces

pytestmark = [pytest.mark.integration]

CHAIN = [
    "The image shows one shape on a white background.",
    "The shape is a circle with a smooth edge.",
    "The circle is filled with a single colour.",
]


async def prefix_cache_counters(base_url: str) -> tuple[float, float]:
    """(queries, hits) of vLLM's prefix cache, in tokens, from its /metrics."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{base_url}/metrics")).text

    def total(name: str) -> float:
        return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.MULTILINE))

    return total("vllm:prefix_cache_queries_total"), total("vllm:prefix_cache_hits_total")


async def test_a_vllm_judge_serves_the_later_calls_of_a_request_from_its_prefix_cache(vllm_server: Any) -> None:
    config = JudgeConfig(
        name="vllm-judge",
        backend="openai",
        model=vllm_server.model,
        base_url=vllm_server.openai_base_url,
        api_key="EMPTY",  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0.0,
        timeout_s=120,
        max_retries=0,
    )
    detector = JudgeDetector({config.name: build_judge(config)}, config.name)
    fixture = spec.get("green_circle")
    image = parse_image_url(spec.data_url("green_circle"))
    question = f"{fixture.question} (request {id(detector)})"  # a prefix no earlier test left in the cache
    ctx = RequestView("judge-cache", vllm_server.model, [], question, (image,))
    per_call: list[tuple[float, float]] = []
    try:
        for i, text in enumerate(CHAIN):
            before = await prefix_cache_counters(vllm_server.base_url)
            step = Step(index=i, text=text, raw=text, kind=StepKind.PERCEPTION)
            with pytest.raises(DetectorError) as info:  # the fixture model does not write verdicts
                await detector.check(ctx, [step])
            assert info.value.code == "unparseable"
            after = await prefix_cache_counters(vllm_server.base_url)
            per_call.append((after[0] - before[0], after[1] - before[1]))
            ctx = ctx.with_accepted([*ctx.accepted, step])
    finally:
        await detector.aclose()
    usage = ctx.judge_state.usage
    assert usage.calls == len(CHAIN) and usage.input_tokens > 0 and usage.output_tokens > 0
    (queried_1, hits_1), *later = per_call
    assert queried_1 > 0
    for queried, hits in later:
        # everything up to the end of the previous call's chain is a whole-block hit: the system prompt
        # alone is hundreds of tokens, the new sentence and the request line a few dozen
        assert queried > 0 and hits / queried > 0.7, per_call
    assert ctx.judge_state.descriptions == 0  # nothing the tiny model wrote was a description


async def test_the_anthropic_judge_sends_breakpoints_and_the_bill_shows_cache_tokens(
    vllm_server: Any, tmp_path: Path
) -> None:
    judge_app = create_judge_app(spec.oracle_json())
    async with running_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url:
        settings = local_judge_settings(vllm_server.base_url, judge_url, trace_path=str(tmp_path / "traces.jsonl"))
        async with running_app(create_app(settings)) as proxy_url:
            client = AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0, timeout=120)
            try:
                body = {
                    "model": vllm_server.model,
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "image_url", "image_url": {"url": spec.data_url("green_circle")}},
                                {"type": "text", "text": spec.get("green_circle").question},
                            ],
                        }
                    ],
                    "max_tokens": 200,
                    "temperature": 0.0,
                }
                response = await client.chat.completions.create(**body, extra_headers={"X-Faithproxy-Judge": "claude"})
            finally:
                await client.close()
            metrics = await proxy_metrics(proxy_url)
    judge = judge_app.state.judge
    bill = response.model_extra["faithfulness"]["judge"]
    assert bill["calls"] == judge.requests == judge.by_protocol["anthropic"] >= 1
    assert judge.last_request is not None and judge.last_request["cache_control"] >= 2
    assert bill["cache_creation_tokens"] == judge.tokens.cache_creation_tokens > 0
    assert bill["cached_input_tokens"] == judge.tokens.cached_input_tokens
    if bill["calls"] > 1:  # a later call of the request reads what the first wrote
        assert bill["cached_input_tokens"] > 0
    assert bill["descriptions"] == 1 == judge.descriptions
    (trace,) = read_traces(tmp_path / "traces.jsonl")
    assert trace["judge_usage"] == bill
    assert (
        metric(metrics, "faithproxy_judge_tokens_total", judge="claude", kind="cache_creation")
        == bill["cache_creation_tokens"]
    )
    assert metric(metrics, "faithproxy_judge_calls_total", judge="claude") == bill["calls"]
