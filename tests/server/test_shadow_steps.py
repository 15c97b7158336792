"""Shadow checks count each perception step as detect mode does, door by door (server/shadow/checker.py).

The chain has two unfaithful perception steps, the second after the first flag. The reference is detect
mode on the same door and the same chain, each step checked on its own (max_batch_steps=1: live detect
batches the steps that finished while the judge was busy, and a judge names only the first unfaithful step
of a batch, so the steps after it would be left unknown there). The shadow check runs under the default
batching (16 steps): its replay reads the captured round one word at a time and answers every check the
machine asks for before the next word, so its batches hold the step that just ended. What is compared, step
by step: text, kind and verdict in the trace records, and the perception-step counters by verdict.

Every off door is sampled: chat completions, completions, Responses and Messages, streamed and not; the fake
vLLM (faithproxy.testing.FakeUpstream) speaks chat and completions, and `DoorsUpstream` below adds vLLM's
/v1/responses and /v1/messages wires for the same sentences (vLLM's event names and item shapes).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, metric, running_app
from faithproxy.testing.answer import Answer

CHAIN = [
    "The image shows a red circle. ",
    "It is on a white background. ",
    "A blue square sits above the circle. ",
    "The circle has a thin black outline. ",
    "So the answer is red.",
]
UNFAITHFUL = [CHAIN[0], CHAIN[2]]  # the second comes after the first flag
STEPS = "faithproxy_perception_steps_total"
SAMPLED = "faithproxy_shadow_requests_total"
QUESTION = "What is in the image?"


def _event(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


class DoorsUpstream(FakeUpstream):
    """The fake vLLM plus its Responses and Messages endpoints, answering CHAIN as reasoning (the chat
    script's chain in its `reasoning` field: the same round)."""

    def answer(self, method: str, path: str, raw: bytes) -> Answer:
        if method != "POST" or path not in ("/v1/responses", "/v1/messages"):
            return super().answer(method, path, raw)
        self.requests.append(httpx.Request(method, f"http://vllm.test{path}", content=raw))
        stream = json.loads(raw).get("stream") is True
        if path == "/v1/responses":
            return _responses(stream)
        return _messages(stream)


def _responses(stream: bool) -> Answer:
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": ""}]}
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
    if not stream:
        item["content"] = [{"type": "reasoning_text", "text": "".join(CHAIN)}]
        return Answer.json(200, json.dumps({**response, "output": [item]}).encode())
    frames = [_event("response.created", response={**response, "status": "in_progress"})]
    frames.append(_event("response.output_item.added", output_index=0, item=item))
    for sentence in CHAIN:
        frames.append(_event("response.reasoning_text.delta", item_id="rs_1", output_index=0, delta=sentence))
    frames.append(_event("response.reasoning_text.done", item_id="rs_1", output_index=0, text="".join(CHAIN)))
    frames.append(_event("response.completed", response=response))
    return Answer(200, "text/event-stream", tuple(frames))


def _messages(stream: bool) -> Answer:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": []}
    if not stream:
        content = [{"type": "thinking", "thinking": "".join(CHAIN), "signature": ""}]
        return Answer.json(200, json.dumps({**message, "content": content, "stop_reason": "end_turn"}).encode())
    frames = [_event("message_start", message=message)]
    frames.append(_event("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}))
    for sentence in CHAIN:
        frames.append(_event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": sentence}))
    frames.append(_event("content_block_stop", index=0))
    frames.append(_event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 40}))
    frames.append(_event("message_stop"))
    return Answer(200, "text/event-stream", tuple(frames))


@contextlib.asynccontextmanager
async def proxy(
    tmp_path: Path, name: str, field: str, **overrides: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """(http client, app state) of a proxy whose judge flags UNFAITHFUL and whose vLLM says CHAIN in `field`."""
    judge_app = create_judge_app({"unfaithful": [s.strip() for s in UNFAITHFUL]})
    async with contextlib.AsyncExitStack() as stack:
        judge_url = await stack.enter_async_context(running_judge_server(judge_app))
        judge = JudgeConfig(name="claude", backend="anthropic", model="judge-model", base_url=judge_url,
                            api_key="sk-test", timeout_s=5, max_retries=0)  # type: ignore[arg-type]  # fmt: skip
        settings = Settings(upstream_url="http://vllm.test", trace_path=str(tmp_path / f"{name}.jsonl"),
                            judges=[judge], max_retries=0, **overrides)  # fmt: skip
        upstream = DoorsUpstream(Sentences(list(CHAIN), field=field, reply_text="".join(CHAIN)))
        app = create_app(settings, upstream_transport=upstream.transport())
        url = await stack.enter_async_context(running_app(app))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield http, app.state.faithproxy


def steps_of(path: Path, source: str) -> list[tuple[str, str, str]]:
    """(text, kind, detected verdict) of each step of the one record of `source` in the trace file."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    [record] = [r for r in records if r["source"] == source]
    return [(s["text"], s["kind"], s["detected"]) for s in record["steps"]]


# door path, request body, the field the fake vLLM's chat stream carries the chain in
DOORS = [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": QUESTION}]}, "content"),
    ("/v1/completions", {"model": "m", "prompt": QUESTION, "max_tokens": 32}, "content"),
    ("/v1/responses", {"model": "m", "input": QUESTION, "max_output_tokens": 32}, "reasoning"),
    (
        "/v1/messages",
        {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": QUESTION}]},
        "reasoning",
    ),
]


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("path", "body", "field"), DOORS)
async def test_the_shadow_check_counts_every_step_as_detect_mode_does(
    tmp_path: Path, path: str, body: dict[str, Any], field: str, stream: bool
) -> None:
    body = {**body, "stream": stream}
    async with proxy(tmp_path, "shadow", field, shadow_share=1.0) as (http, state):  # default batching
        off = await http.post(path, json=body, headers={"x-faithproxy-mode": "off"})
        await state.shadow.drained()
        shadow_metrics = (await http.get("/metrics")).text
    async with proxy(tmp_path, "detect", field, max_batch_steps=1) as (http, _):
        detect = await http.post(path, json=body, headers={"x-faithproxy-mode": "detect"})
        detect_metrics = (await http.get("/metrics")).text
    assert off.status_code == 200 and detect.status_code == 200, (off.text, detect.text)
    assert metric(shadow_metrics, SAMPLED, outcome="checked", endpoint=path) == 1

    shadow = steps_of(tmp_path / "shadow.jsonl", "shadow")
    inline = steps_of(tmp_path / "detect.jsonl", "inline")
    assert shadow == inline  # step by step: text, kind, verdict
    assert [text for text, _, verdict in shadow if verdict == "unfaithful"] == [s.strip() for s in UNFAITHFUL]
    for verdict in ("faithful", "unfaithful", "unknown"):
        counted = metric(shadow_metrics, STEPS, source="shadow", verdict=verdict, endpoint=path)
        assert counted == metric(detect_metrics, STEPS, source="inline", verdict=verdict, endpoint=path), verdict
    assert metric(shadow_metrics, STEPS, source="shadow", verdict="unfaithful", endpoint=path) == 2
    assert metric(shadow_metrics, STEPS, source="shadow", verdict="unknown", endpoint=path) == 0


async def test_a_request_detect_mode_would_refuse_on_its_door_is_counted_unreadable(tmp_path: Path) -> None:
    body = {"model": "m", "prompt": QUESTION, "max_tokens": 32, "echo": True}  # the text would hold the prompt
    async with proxy(tmp_path, "shadow", "content", shadow_share=1.0) as (http, state):
        off = await http.post("/v1/completions", json=body, headers={"x-faithproxy-mode": "off"})
        await state.shadow.drained()
        text = (await http.get("/metrics")).text
    assert off.status_code == 200
    assert metric(text, SAMPLED, outcome="unreadable", endpoint="/v1/completions") == 1
    assert metric(text, STEPS, source="shadow", endpoint="/v1/completions") == 0
