"""Each door's wire shapes are its models: the request model refuses a body in the door's own error format
(OpenAI's `{"error": {...}}` with a `param`, Anthropic's `{"type": "error", "error": {...}}`), in off mode's
pure-ASGI path and in a verified mode alike; what the door renders, whole or streamed, validates against
its declared response models. A real uvicorn proxy in front of a FakeUpstream."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from faithproxy.server.app import create_app
from faithproxy.server.doors import chat, completions, messages, responses
from faithproxy.server.doors.table import DOORS
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, running_app

HI = [{"role": "user", "content": "hi"}]
# (door, a body its model refuses, the field named)
REFUSED = [
    ("/v1/chat/completions", {"model": "m", "messages": HI, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"content": "no role"}]}, "messages"),
    ("/v1/completions", {"model": "m", "prompt": {"a": 1}}, "prompt"),
    ("/v1/completions", {"model": "m", "prompt": "p", "temperature": "hot"}, "temperature"),
    ("/v1/responses", {"model": "m", "input": []}, "input"),
    ("/v1/responses", {"model": "m", "input": "hi", "instructions": 7}, "instructions"),
    ("/v1/messages", {"model": "m", "messages": HI, "max_tokens": 0}, "max_tokens"),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages"),
    ("/v1/messages", {"messages": HI, "max_tokens": 8}, "model"),
]
BODIES = {
    "/v1/chat/completions": {"model": "m", "messages": HI, "max_tokens": 32},
    "/v1/completions": {"model": "m", "prompt": "<|user|>hi<|assistant|>", "max_tokens": 32},
    "/v1/responses": {"model": "m", "input": "hi", "max_output_tokens": 32, "top_p": 0.9, "metadata": {"k": "v"}},
    "/v1/messages": {"model": "m", "messages": HI, "max_tokens": 32},
}
# Every event a streamed door writes, by type, and its model.
EVENTS: dict[str, dict[str, type[BaseModel]]] = {
    "/v1/responses": {
        "response.created": responses.ResponseEvent,
        "response.in_progress": responses.ResponseEvent,
        "response.completed": responses.ResponseEvent,
        "response.output_item.added": responses.OutputItemEvent,
        "response.output_item.done": responses.OutputItemEvent,
        "response.content_part.added": responses.ContentPartEvent,
        "response.content_part.done": responses.ContentPartEvent,
        "response.output_text.delta": responses.TextDeltaEvent,
        "response.output_text.done": responses.TextDoneEvent,
        "response.faithfulness.verdicts": responses.VerdictsEvent,
    },
    "/v1/messages": {
        "message_start": messages.MessageStart,
        "content_block_start": messages.ContentBlockStart,
        "content_block_delta": messages.ContentBlockDelta,
        "content_block_stop": messages.ContentBlockStop,
        "message_delta": messages.MessageDelta,
        "message_stop": messages.MessageStop,
        "ping": messages.Ping,
    },
}
CHUNKS = {"/v1/chat/completions": chat.ChatCompletionChunk, "/v1/completions": completions.CompletionChunk}


@pytest.fixture
async def proxy() -> Any:
    upstream = FakeUpstream(Sentences())
    settings = Settings(upstream_url="http://vllm.test", default_detector="none", max_tokens_cap=64)
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        yield url, upstream


async def test_a_model_refuses_in_its_doors_error_format(proxy: Any) -> None:
    url, upstream = proxy
    async with httpx.AsyncClient(timeout=10) as http:
        for path, body, field in REFUSED:
            for mode in ("off", "correct"):
                answer = await http.post(f"{url}{path}", json=body, headers={"x-faithproxy-mode": mode})
                assert answer.status_code == 400, (path, body, mode, answer.text)
                error = answer.json()["error"]
                assert error["type"] == "invalid_request_error" and f"'{field}" in error["message"], (path, error)
                if DOORS[path].api.value == "anthropic":
                    assert answer.json()["type"] == "error" and "param" not in error
                else:
                    assert error["param"] == field and set(error) == {"message", "type", "param", "code"}
    assert all(r.url.path == "/v1/models" for r in upstream.requests)  # nothing reached vLLM


def _events(text: str) -> list[tuple[str | None, str]]:
    """(the event's name, its data) of each event of a stream."""
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "data" in lines:
            out.append((lines.get("event"), lines["data"]))
    return out


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("mode", ["detect", "correct"])
async def test_what_a_door_renders_validates_against_its_response_models(proxy: Any, path: str, mode: str) -> None:
    url, _ = proxy
    door = DOORS[path]
    headers = {"x-faithproxy-mode": mode, "x-faithproxy-detector": "none"}
    async with httpx.AsyncClient(timeout=10) as http:
        whole = await http.post(f"{url}{path}", json=BODIES[path], headers=headers)
        streamed = await http.post(f"{url}{path}", json={**BODIES[path], "stream": True}, headers=headers)
    assert whole.status_code == 200 and streamed.status_code == 200, (whole.text, streamed.text)
    body = door.openapi_responses[200]["model"].model_validate_json(whole.content)
    assert body.model_extra is not None and "faithproxy_judge_usage" in body.model_extra
    if path == "/v1/responses":
        assert body.top_p == 0.9 and body.metadata == {"k": "v"}  # the request's settings, echoed
    events = _events(streamed.text)
    assert events
    for name, data in events:
        if data == "[DONE]":
            continue
        if path in CHUNKS:
            CHUNKS[path].model_validate_json(data)
            continue
        event = EVENTS[path][json.loads(data)["type"]].model_validate_json(data)
        assert event.type == name  # type: ignore[attr-defined]


async def test_blocks_the_model_documents_but_leaves_to_the_translation_are_refused_there(proxy: Any) -> None:
    """Anthropic blocks are documented, not validated (any block passes to vLLM in off mode): a block that
    is no object is the translation's 400 in a verified mode, in Anthropic's format, never a 500."""
    url, _ = proxy
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [5, {"type": "text", "text": 7}]}]}
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(f"{url}/v1/messages", json=body, headers={"x-faithproxy-mode": "correct"})
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error", answer.text
    assert "messages[0].content[0]" in answer.json()["error"]["message"]
