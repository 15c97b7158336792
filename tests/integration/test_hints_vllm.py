"""Collaborative hint inference in front of real vLLM: the generator receives [topic hint, question,
question hint] in the last user turn; judges still see the client's own question; failures of the hint
judge never fail the request and are counted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import HINT_REPLY
from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.server.app import create_app
from faithproxy.server.chain.hints import parse_hint_reply
from faithproxy.testing import metric, running_app
from tests.support import local_judge_settings, proxy_metrics, read_traces

pytestmark = [pytest.mark.integration]
HINTS = parse_hint_reply(HINT_REPLY)


class RequestRecorder(httpx.AsyncBaseTransport):
    """Forwards to vLLM and keeps the JSON body of every chat request the proxy sent."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.chat_bodies: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            self.chat_bodies.append(json.loads(await request.aread()))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class HintStack:
    proxy_url: str
    model: str
    judge_app: Any
    recorder: RequestRecorder
    traces: Path

    def last_trace(self) -> dict[str, Any]:
        return read_traces(self.traces)[-1]


@pytest.fixture
async def hint_stack(vllm_server: Any, tmp_path: Path) -> AsyncIterator[HintStack]:
    judge_app = create_judge_app(spec.oracle_json())
    async with running_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url:
        traces = tmp_path / "traces.jsonl"
        settings = local_judge_settings(vllm_server.base_url, judge_url, trace_path=str(traces), hint_judge="qwen")
        recorder = RequestRecorder()
        async with running_app(create_app(settings, upstream_transport=recorder)) as proxy_url:
            yield HintStack(proxy_url, vllm_server.model, judge_app, recorder, traces)


def body(model: str) -> dict[str, Any]:
    f = spec.get("green_circle")
    image = {"type": "image_url", "image_url": {"url": spec.data_url("green_circle")}}
    return {"model": model, "messages": [{"role": "user", "content": [image, {"type": "text", "text": f.question}]}],
            "temperature": 0, "max_tokens": 120}  # fmt: skip


async def post(stack: HintStack, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=120) as http:
        return await http.post(f"{stack.proxy_url}/v1/chat/completions", json=body(stack.model), headers=headers)


async def test_the_generator_sees_topic_hint_question_question_hint(hint_stack: HintStack) -> None:
    assert HINTS is not None
    question = spec.get("green_circle").question
    reply = await post(hint_stack, {"X-Faithproxy-Hints": "on", "X-Faithproxy-Detector": "judge"})
    assert reply.status_code == 200, reply.text
    first = hint_stack.recorder.chat_bodies[0]  # the first generation request of the chain
    parts = first["messages"][-1]["content"]
    assert parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"] == spec.data_url("green_circle")
    text = parts[1]["text"]
    assert text.index(HINTS.topic_hint) < text.index(question) < text.index(HINTS.question_hint)
    trace = hint_stack.last_trace()
    assert trace["hints"] == {"outcome": "applied", "question_type": "attribute", "topic_hint": HINTS.topic_hint,
                              "question_hint": HINTS.question_hint}  # fmt: skip
    assert trace["prompt"] == question  # judges are told the client's question, not the hinted one
    metrics = await proxy_metrics(hint_stack.proxy_url)
    assert metric(metrics, "faithproxy_hint_requests_total", outcome="applied") == 1
    assert metric(metrics, "faithproxy_hint_seconds_count") == 1


async def test_without_the_header_nothing_changes(hint_stack: HintStack) -> None:
    reply = await post(hint_stack, {"X-Faithproxy-Detector": "none"})
    assert reply.status_code == 200
    assert hint_stack.recorder.chat_bodies[0]["messages"] == body(hint_stack.model)["messages"]
    assert hint_stack.last_trace()["hints"] is None


async def test_a_failing_hint_judge_leaves_the_question_as_it_was(hint_stack: HintStack) -> None:
    hint_stack.judge_app.state.judge.mode = "500"
    reply = await post(hint_stack, {"X-Faithproxy-Hints": "on", "X-Faithproxy-Detector": "none"})
    assert reply.status_code == 200, reply.text
    assert hint_stack.recorder.chat_bodies[0]["messages"] == body(hint_stack.model)["messages"]
    assert hint_stack.last_trace()["hints"] == {"outcome": "error", "reason": "status_5xx"}
    metrics = await proxy_metrics(hint_stack.proxy_url)
    assert metric(metrics, "faithproxy_hint_requests_total", outcome="error") == 1
    assert metric(metrics, "faithproxy_hint_requests_total", outcome="applied") == 0


async def test_hints_with_off_mode_are_refused(hint_stack: HintStack) -> None:
    reply = await post(hint_stack, {"X-Faithproxy-Hints": "on", "X-Faithproxy-Mode": "off"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "x-faithproxy-hints"
    assert hint_stack.recorder.chat_bodies == []
