"""POST /v1/messages (Anthropic Messages API): the chat door's session driven from a Messages request,
answered in Messages events, through a real uvicorn proxy, a FakeUpstream and the official anthropic SDK
(`messages.create`, `messages.stream` with `get_final_message`); thinking blocks; errors in Anthropic's
format before and after the first byte; off's pass-through. Real vLLM: tests/integration/test_doors_vllm.py.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.app import create_app
from faithproxy.server.doors.messages import chat_body
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, metric, running_app
from tests.server.test_openai_responses import Thinking

EXPECTED = "".join(Sentences().sentences)
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def test_chat_body_from_a_messages_request() -> None:
    request = {
        "model": "m",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [IMAGE, {"type": "text", "text": "What colour?"}]},
            {"role": "assistant", "content": "Red."},
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}]},
        ],
        "stop_sequences": ["END"],
        "temperature": 0.0,
        "thinking": {"type": "disabled"},
    }
    assert chat_body(request) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                    {"type": "text", "text": "What colour?"},
                ],
            },
            {"role": "assistant", "content": "Red."},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]},
        ],
        "max_tokens": 64,
        "stream": False,
        "stop": ["END"],
        "temperature": 0.0,
        "include_reasoning": False,
    }


@pytest.fixture
async def proxy() -> Any:
    upstream = FakeUpstream(Sentences())
    settings = Settings(upstream_url="http://vllm.test", default_detector="none", max_tokens_cap=64)
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        yield url, upstream


def client(url: str, mode: str, **headers: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=url, api_key="x", max_retries=0, default_headers={"x-faithproxy-mode": mode, **headers}
    )


@pytest.mark.parametrize("mode", ["detect", "correct"])
async def test_anthropic_sdk_messages(proxy: Any, mode: str) -> None:
    url, upstream = proxy
    sdk = client(url, mode, **{"x-faithproxy-annotate": "true"})
    ask: dict[str, Any] = {"model": "m", "max_tokens": 32, "system": "Be brief."}
    message = await sdk.messages.create(
        **ask, messages=[{"role": "user", "content": [IMAGE, {"type": "text", "text": "?"}]}]
    )
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == EXPECTED  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0
    assert (message.model_extra or {})["faithfulness"]["mode"] == mode

    async with sdk.messages.stream(**ask, messages=[{"role": "user", "content": "hi"}]) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_message()
    assert final.content[0].text == EXPECTED  # type: ignore[union-attr]
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert "".join(e.delta.text for e in deltas) == EXPECTED  # type: ignore[union-attr]
    if mode == "correct":  # one delta per verified step, each with its annotation
        assert len(deltas) == 3 and all("step" in (e.model_extra or {}).get("faithfulness", {}) for e in deltas)
    await sdk.close()
    sent = [json.loads(r.content) for r in upstream.requests if r.url.path == "/v1/chat/completions"]
    assert len(sent) == 2 and sent[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent[0]["max_tokens"] == 32


async def test_thinking_blocks_carry_the_verified_reasoning() -> None:
    upstream = FakeUpstream(Thinking())
    settings = Settings(upstream_url="http://vllm.test", default_detector="none")
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        sdk = client(url, "correct")
        async with sdk.messages.stream(
            model="m", max_tokens=32, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            thinking = "".join([e.thinking async for e in stream if e.type == "thinking"])
            final = await stream.get_final_message()
        await sdk.close()
    assert thinking == "I see a circle. It is red."
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == "The answer is red."  # type: ignore[union-attr]


async def test_a_broken_upstream_is_an_anthropic_error_event() -> None:
    upstream = FakeUpstream(Sentences(), fault="die_mid_stream")
    settings = Settings(upstream_url="http://vllm.test", default_detector="none")
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        sdk = client(url, "detect")
        with pytest.raises(anthropic.APIStatusError):
            async with sdk.messages.stream(model="m", max_tokens=32, messages=[{"role": "user", "content": "hi"}]) as s:
                async for _ in s:
                    pass
        await sdk.close()


async def test_off_mode_passes_vllm_messages_through(proxy: Any) -> None:
    url, upstream = proxy
    raw = json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "tools": []})
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(
            f"{url}/v1/messages", content=raw, headers={"x-faithproxy-mode": "off", "content-type": "application/json"}
        )
    assert answer.headers["x-faithproxy-mode"] == "off"
    forwarded = [r for r in upstream.requests if r.url.path == "/v1/messages"]
    assert len(forwarded) == 1 and forwarded[0].content == raw.encode()
    assert answer.status_code == 404  # the fake serves no /v1/messages: its own answer comes back


HI = [{"role": "user", "content": "hi"}]
# (what is wrong, the body, the modes that refuse it, the status)
REFUSALS = [
    ("no max_tokens", {"model": "m", "messages": HI}, ("off", "detect", "correct"), 400),
    ("no model", {"max_tokens": 8, "messages": HI}, ("off", "detect", "correct"), 400),
    ("no messages", {"model": "m", "max_tokens": 8, "messages": []}, ("off", "correct"), 400),
    ("max_tokens over the cap", {"model": "m", "max_tokens": 100, "messages": HI}, ("off", "correct"), 400),
    ("tools", {"model": "m", "max_tokens": 8, "messages": HI, "tools": [{"name": "t"}]}, ("detect", "correct"), 400),
    (
        "a document block",
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
        ("correct",),
        400,
    ),
]


@pytest.mark.parametrize(("case", "payload", "modes", "status"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_refusals_in_anthropic_format(
    proxy: Any, case: str, payload: dict[str, Any], modes: tuple[str, ...], status: int
) -> None:
    url, upstream = proxy
    async with httpx.AsyncClient(timeout=10) as http:
        for mode in modes:
            answer = await http.post(f"{url}/v1/messages", json=payload, headers={"x-faithproxy-mode": mode})
            assert answer.status_code == status, (case, mode, answer.text)
            body = answer.json()
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", (case, mode)
        exposition = (await http.get(f"{url}/metrics")).text
    assert all(r.url.path == "/v1/models" for r in upstream.requests)  # nothing but the listing at start
    assert metric(exposition, "faithproxy_requests_total", mode="rejected", status="4xx") == len(modes)


async def test_middleware_refusals_on_every_door_are_counted_in_the_doors_format() -> None:
    """A body over the size limit, refused before any door reads it, counts as rejected on each door, under
    the door's endpoint label, and is answered in the door's error format (Anthropic's on /v1/messages)."""
    settings = Settings(upstream_url="http://vllm.test", max_body_bytes=64)
    doors = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
    async with running_app(create_app(settings, upstream_transport=FakeUpstream().transport())) as url:
        async with httpx.AsyncClient(timeout=10) as http:
            for path in doors:
                answer = await http.post(
                    f"{url}{path}", content=b"x" * 100, headers={"content-type": "application/json"}
                )
                assert answer.status_code == 413, path
                if path == "/v1/messages":
                    assert answer.json() == {"type": "error", "error": {"type": "request_too_large",
                                             "message": answer.json()["error"]["message"]}}  # fmt: skip
                else:
                    assert answer.json()["error"]["code"] == "body_too_large", path
            exposition = (await http.get(f"{url}/metrics")).text
    for path in doors:
        assert metric(exposition, "faithproxy_requests_total", mode="rejected", status="4xx", endpoint=path) == 1


async def test_the_anthropic_sdks_api_key_header_is_the_clients_key() -> None:
    """The anthropic SDK sends `x-api-key`: accepted as the client's key on /v1/messages; a wrong key is a
    401 the SDK raises as AuthenticationError (Anthropic's format)."""
    settings = Settings(upstream_url="http://vllm.test", default_detector="none", api_keys=["sk-good"])
    upstream = FakeUpstream(Sentences())
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        ask: dict[str, Any] = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
        async with anthropic.AsyncAnthropic(base_url=url, api_key="sk-good", max_retries=0) as good:
            message = await good.messages.create(**ask)
        assert "".join(block.text for block in message.content if block.type == "text") == EXPECTED
        async with anthropic.AsyncAnthropic(base_url=url, api_key="sk-bad", max_retries=0) as bad:
            with pytest.raises(anthropic.AuthenticationError):
                await bad.messages.create(**ask)
        async with httpx.AsyncClient(timeout=10) as http:  # x-api-key is no key on the other doors
            other = await http.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": ask["messages"]},
                                    headers={"x-api-key": "sk-good"})  # fmt: skip
        assert other.status_code == 401 and other.json()["error"]["code"] == "invalid_api_key"


def test_thinking_blocks_sent_back_are_the_assistant_messages_reasoning() -> None:
    """An earlier turn's thinking (as the SDK's get_final_message() gives it back) maps to the assistant
    message's `reasoning`, as vLLM's own /v1/messages maps it; redacted thinking is left out; thinking in a
    user message is a 400."""
    turn = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I see a circle.", "signature": ""},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "text", "text": "Red."},
        ],
    }
    body = chat_body({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}, turn]})
    assert body["messages"][1] == {
        "role": "assistant",
        "reasoning": "I see a circle.",
        "content": [{"type": "text", "text": "Red."}],
    }
    misplaced = {"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}
    with pytest.raises(PolicyError, match="thinking blocks belong to assistant messages"):
        chat_body({"model": "m", "max_tokens": 8, "messages": [misplaced]})
