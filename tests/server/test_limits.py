"""Request limits (server/admission/limits.py): sizes, images, max_tokens, concurrency; a real uvicorn proxy in
front of a MockTransport vLLM that records what reaches it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.clients.vllm import CHAT_PATH as CHAT
from faithproxy.faithcore.errors import PayloadTooLarge, PolicyError
from faithproxy.server.admission.limits import check_body
from faithproxy.server.admission.media_parts import data_url_size
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, delta, frames, metric, running_app, sse

HEADERS = {"x-faithproxy-detector": "none"}
PNG = base64.b64encode(b"\x89PNG" + bytes(2000)).decode()


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}], **extra}


def with_images(*urls: str, **extra: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return body(messages=[{"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}], **extra)


@contextlib.asynccontextmanager
async def proxy(vllm: FakeUpstream, **overrides: Any) -> AsyncIterator[str]:
    app = create_app(Settings(upstream_url="http://vllm.test", **overrides), upstream_transport=vllm.transport())
    async with running_app(app) as url:
        yield url


def chat_calls(vllm: FakeUpstream) -> list[httpx.Request]:
    return [r for r in vllm.requests if r.url.path == "/v1/chat/completions"]


async def post(url: str, payload: Any, headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        if isinstance(payload, dict):
            kwargs["json"] = payload
        else:
            kwargs["content"] = payload
        return await http.post(f"{url}/v1/chat/completions", headers={**HEADERS, **(headers or {})}, **kwargs)


# ---- sizes ------------------------------------------------------------------------------------


async def test_body_over_the_limit_is_413_from_content_length() -> None:
    vllm = FakeUpstream()
    async with proxy(vllm, max_body_bytes=1000) as url:
        response = await post(url, body(padding="x" * 2000))
        small = await post(url, body())
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "body_too_large" and error["type"] == "invalid_request_error"
    assert small.status_code == 200 and len(chat_calls(vllm)) == 1


async def test_streamed_body_over_the_limit_is_413_while_reading() -> None:
    vllm = FakeUpstream()

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the limit must count bytes read
        data = json.dumps(body(padding="x" * 5000)).encode()
        for i in range(0, len(data), 500):
            yield data[i : i + 500]

    async with proxy(vllm, max_body_bytes=1000) as url:
        response = await post(url, chunked(), headers={"content-type": "application/json"})
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{url}/metrics")).text
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
    assert chat_calls(vllm) == []
    assert metric(metrics, "faithproxy_requests_total", mode="rejected", status="4xx", endpoint=CHAT) == 1


async def test_headers_over_the_limit_are_431() -> None:
    vllm = FakeUpstream()
    async with proxy(vllm, max_header_bytes=2048) as url:
        response = await post(url, body(), headers={"x-padding": "y" * 4000})
    assert response.status_code == 431
    assert response.json()["error"]["code"] == "headers_too_large"
    assert chat_calls(vllm) == []


# ---- images -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["correct", "off"])
async def test_too_many_images_is_400(mode: str) -> None:
    vllm = FakeUpstream()
    async with proxy(vllm, max_images_per_request=2) as url:
        urls = [f"data:image/png;base64,{PNG}"] * 3
        response = await post(url, with_images(*urls), headers={"x-faithproxy-mode": mode})
        ok = await post(url, with_images(*urls[:2]), headers={"x-faithproxy-mode": mode})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "too_many_images" and error["param"] == "messages"
    assert ok.status_code == 200 and len(chat_calls(vllm)) == 1


@pytest.mark.parametrize("mode", ["correct", "off"])
async def test_image_over_the_size_limit_is_413(mode: str) -> None:
    vllm = FakeUpstream()
    async with proxy(vllm, max_image_bytes=1000) as url:
        response = await post(url, with_images(f"data:image/png;base64,{PNG}"), headers={"x-faithproxy-mode": mode})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "image_too_large"
    assert chat_calls(vllm) == []


def test_every_doors_images_count_against_the_limits() -> None:
    """Responses input_image parts and Anthropic image blocks (base64 and url) count like chat's parts."""
    big = base64.b64encode(b"x" * 1500).decode()
    responses = {
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": f"data:image/png;base64,{big}"}]}]
    }
    anthropic = {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://images.example.test/a.png"}},
        {"type": "tool_result", "content": [
            {"type": "image", "source": {"type": "base64", "data": big}}]}]}]}  # fmt: skip
    for request, where in (
        (responses, "input[0].content[0].image_url"),
        (anthropic, "messages[0].content[1].content[0].source"),
    ):
        with pytest.raises(PayloadTooLarge, match=re.escape(where)):
            check_body(request, Settings(max_image_bytes=1000))
    with pytest.raises(PolicyError, match="Too many images"):
        check_body(anthropic, Settings(max_images_per_request=1))
    assert check_body(anthropic, Settings(max_images_per_request=2, max_image_bytes=2000)) is False


@given(raw=st.binary(max_size=2000))
def test_data_url_size_is_the_decoded_size(raw: bytes) -> None:
    assert data_url_size("data:image/png;base64," + base64.b64encode(raw).decode()) == len(raw)
    assert data_url_size("data:nothing") == 0


# ---- max_tokens -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_above_the_cap_is_400(name: str) -> None:
    vllm = FakeUpstream()
    async with proxy(vllm, max_tokens_cap=100) as url:
        response = await post(url, body(**{name: 101}))
        ok = await post(url, body(**{name: 100}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "max_tokens_too_large" and error["param"] == name
    assert ok.status_code == 200
    (call,) = chat_calls(vllm)
    assert json.loads(call.content)[name] == 100


@pytest.mark.parametrize("mode", ["correct", "off"])
async def test_cap_is_added_when_the_request_sets_none(mode: str) -> None:
    vllm = FakeUpstream()
    async with proxy(vllm, max_tokens_cap=64) as url:
        response = await post(url, body(top_k=3), headers={"x-faithproxy-mode": mode})
    assert response.status_code == 200
    (call,) = chat_calls(vllm)
    sent = json.loads(call.content)
    assert sent["max_tokens"] == 64 and sent["top_k"] == 3


async def test_without_a_cap_off_mode_forwards_the_same_bytes() -> None:
    vllm = FakeUpstream()
    raw = b'{"model":"m",  "messages":[{"role":"user","content":"hi"}], "max_tokens": 7}'
    async with proxy(vllm) as url:
        response = await post(url, raw, headers={"x-faithproxy-mode": "off", "content-type": "application/json"})
    assert response.status_code == 200
    assert chat_calls(vllm)[0].content == raw


@pytest.mark.parametrize("value", [0, -1, 1.5, "10", True, 0.0])
def test_max_tokens_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(PolicyError) as info:
        check_body(body(max_tokens=value), Settings())
    assert info.value.param == "max_tokens" and info.value.status_code == 400


def test_integral_float_max_tokens_is_an_integer() -> None:
    request = body(max_tokens=256.0)
    assert check_body(request, Settings(max_tokens_cap=256)) is False
    assert request["max_tokens"] == 256 and isinstance(request["max_tokens"], int)


def test_check_body_errors_are_the_documented_classes() -> None:
    settings = Settings(max_images_per_request=0)
    with pytest.raises(PolicyError) as info:
        check_body(with_images("https://example.com/a.png"), settings)
    assert info.value.code == "too_many_images" and not isinstance(info.value, PayloadTooLarge)
    assert check_body(body(), Settings()) is False


# ---- concurrency ------------------------------------------------------------------------------


class HeldVLLM(FakeUpstream):
    """Streams that stay open until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.both_open = asyncio.Event()
        self.open = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle(request)
        if request.url.path != "/v1/chat/completions":
            return response

        async def content() -> AsyncIterator[bytes]:
            self.open += 1
            if self.open == 2:
                self.both_open.set()
            yield sse(delta("The image shows a red circle. "), done=False)
            await self.release.wait()
            yield sse(delta("It is red.", "stop"))

        return httpx.Response(200, content=content(), headers={"content-type": "text/event-stream"})


async def test_beyond_the_concurrency_limit_is_429_with_retry_after() -> None:
    vllm = HeldVLLM()
    async with proxy(vllm, max_concurrent_requests=2, retry_after_s=3) as url:
        async with httpx.AsyncClient(timeout=10) as http:
            held = [
                asyncio.create_task(http.post(f"{url}/v1/chat/completions", json=body(stream=True), headers=HEADERS))
                for _ in range(2)
            ]
            await asyncio.wait_for(vllm.both_open.wait(), 10)
            refused = await http.post(f"{url}/v1/chat/completions", json=body(), headers=HEADERS)
            health = await http.get(f"{url}/healthz")
            metrics = (await http.get(f"{url}/metrics")).text
            vllm.release.set()
            done = await asyncio.gather(*held)
            after = await http.post(f"{url}/v1/chat/completions", json=body(), headers=HEADERS)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "too_many_concurrent_requests"
    assert health.status_code == 200  # probes are never limited
    assert metric(metrics, "faithproxy_requests_total", mode="rejected", status="4xx", endpoint=CHAT) == 1
    assert all(frames(r.text)[-1] == "[DONE]" for r in done)  # the held streams finished normally
    assert after.status_code == 200  # slots come back when streams end
