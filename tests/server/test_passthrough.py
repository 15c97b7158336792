"""Off mode end to end, with real servers on 127.0.0.1: the proxy (server/doors/off.py, pure ASGI)
in front of a raw ASGI upstream that records the bytes it receives and answers with scripted bytes.

What the client gets is what the upstream sent, byte for byte, status and content type included,
errors as well; what the upstream gets is what the client sent; checks of the body and the headers
answer before anything goes upstream; a client that leaves mid-stream makes the proxy hang up.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.server.app import create_app
from faithproxy.server.doors import serving
from faithproxy.server.settings import Settings
from faithproxy.testing import frames, metric, running_app, threaded_app

OFF = {"x-faithproxy-mode": "off"}

# Deliberately irregular event streams: comments, a field without a space, unicode, odd spacing.
STREAM = (
    b": ping\n\n"
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
    b'data:{"id":"c1",  "choices":[{"index":0,"delta":{"content":"Caf\xc3\xa9 \\u00e9t\xc3\xa9"}}], "x":1}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
COMPLETION = (
    b'{ "id" : "c2","object":"chat.completion", "choices":[{"index":0,"message":{"role":"assistant",\n'
    b'"content":"ok"},"finish_reason":"stop"}] }'
)


@dataclass
class Script:
    """What the upstream answers next, and what it saw."""

    status: int = 200
    content_type: bytes | None = b"text/event-stream"
    pieces: list[bytes] = field(default_factory=lambda: [STREAM])
    gap_s: float = 0.0  # pause before each piece
    bodies: list[bytes] = field(default_factory=list)
    disconnected: asyncio.Event | None = None  # set (thread-safely) when the proxy hangs up
    loop: asyncio.AbstractEventLoop | None = None


def upstream_app(script: Script) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/v1/models":
            body = b'{"object":"list","data":[{"id":"m","object":"model"}]}'
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": body})
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        script.bodies.append(b"".join(chunks))
        headers = [(b"content-type", script.content_type)] if script.content_type else []
        await send({"type": "http.response.start", "status": script.status, "headers": headers})
        for piece in script.pieces:
            if script.gap_s:
                gone = asyncio.ensure_future(receive())
                done, _ = await asyncio.wait({gone}, timeout=script.gap_s)
                if done and gone.result()["type"] == "http.disconnect":
                    assert script.disconnected is not None and script.loop is not None
                    script.loop.call_soon_threadsafe(script.disconnected.set)
                    return
                gone.cancel()
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


@dataclass
class Proxy:
    url: str
    script: Script
    traces: Path

    async def post(self, body: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with httpx.AsyncClient(timeout=10) as http:
            return await http.post(
                f"{self.url}/v1/chat/completions",
                content=content,
                headers={"content-type": "application/json", **(headers if headers is not None else OFF)},
            )

    async def metrics(self) -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{self.url}/metrics")).text

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.traces.read_text().splitlines()] if self.traces.exists() else []


@pytest.fixture
async def proxy(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Proxy]:
    script = Script()
    overrides = getattr(request, "param", {})
    with threaded_app(upstream_app(script)) as upstream:
        settings = Settings(
            upstream_url=upstream, trace_path=str(tmp_path / "t.jsonl"), default_detector="none", **overrides
        )
        async with running_app(create_app(settings)) as url:
            yield Proxy(url, script, tmp_path / "t.jsonl")


def body(stream: bool, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}


def assert_off_headers(response: httpx.Response) -> None:
    assert re.fullmatch(r"[0-9a-f]{24}", response.headers["x-faithproxy-request-id"])
    assert response.headers["x-faithproxy-mode"] == "off"


async def test_a_stream_comes_back_byte_for_byte(proxy: Proxy) -> None:
    proxy.script.pieces = [STREAM[:7], STREAM[7:100], STREAM[100:]]  # split anywhere, even mid-event
    response = await proxy.post(body(True))
    assert response.status_code == 200 and response.content == STREAM
    assert response.headers["content-type"] == "text/event-stream"
    assert_off_headers(response)


async def test_a_completion_comes_back_byte_for_byte(proxy: Proxy) -> None:
    proxy.script.content_type, proxy.script.pieces = b"application/json", [COMPLETION]
    response = await proxy.post(body(False))
    assert response.status_code == 200 and response.content == COMPLETION
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-length"] == str(len(COMPLETION))
    assert_off_headers(response)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(
    ("status", "content_type", "content"),
    [
        (
            400,
            b"application/json",
            b'{"object":"error","message":"bad max_tokens","type":"BadRequestError","code":400}',
        ),
        (500, b"text/plain; charset=utf-8", b"Internal Server Error"),
        (404, None, b'{"detail":"Not Found"}'),
    ],
)
async def test_upstream_errors_come_back_as_they_are(
    proxy: Proxy, stream: bool, status: int, content_type: bytes | None, content: bytes
) -> None:
    proxy.script.status, proxy.script.content_type, proxy.script.pieces = status, content_type, [content]
    response = await proxy.post(body(stream))
    assert response.status_code == status and response.content == content
    assert response.headers.get("content-type") == (content_type.decode() if content_type else None)
    assert_off_headers(response)
    metrics = await proxy.metrics()
    assert metric(metrics, "faithproxy_requests_total", mode="off", status=f"{status // 100}xx") == 1


async def test_the_client_body_reaches_the_upstream_byte_for_byte(proxy: Proxy) -> None:
    raw = b'{"messages":[{"role":"user","content":"caf\\u00e9"}],  "model":"m","stream":true,"vendor_x":{"k":[1,2.50]}}'
    response = await proxy.post(raw)
    assert response.status_code == 200
    assert proxy.script.bodies == [raw]


@pytest.mark.parametrize("proxy", [{"max_tokens_cap": 64}], indirect=True)
async def test_the_max_tokens_cap_is_added_to_what_goes_upstream(proxy: Proxy) -> None:
    response = await proxy.post(body(True, vendor_x=1))
    assert response.status_code == 200
    assert json.loads(proxy.script.bodies[0]) == body(True, vendor_x=1, max_tokens=64)


@pytest.mark.parametrize(
    ("raw", "headers", "param"),
    [
        (b"{not json", OFF, None),
        (b'{"model":"m","messages":[]}', OFF, "messages"),
        (json.dumps(body(True, max_tokens=0)).encode(), OFF, "max_tokens"),
        (json.dumps(body(True)).encode(), {**OFF, "x-faithproxy-annotate": "maybe"}, "x-faithproxy-annotate"),
        (json.dumps(body(True)).encode(), {**OFF, "x-faithproxy-max-retries": "11"}, "x-faithproxy-max-retries"),
    ],
)
async def test_bad_requests_are_answered_before_anything_goes_upstream(
    proxy: Proxy, raw: bytes, headers: dict[str, str], param: str | None
) -> None:
    response = await proxy.post(raw, headers)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert proxy.script.bodies == []
    assert metric(await proxy.metrics(), "faithproxy_requests_total", mode="rejected", status="4xx") == 1


@pytest.mark.parametrize("proxy", [{"default_mode": "off"}], indirect=True)
@pytest.mark.parametrize("headers", [{}, {"x-faithproxy-mode": "OFF"}])
async def test_off_by_default_or_by_header_never_reaches_the_full_path(
    proxy: Proxy, headers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuse(self: Any) -> None:
        raise AssertionError("the router's serving object was used")

    monkeypatch.setattr(serving.DoorServing, "respond", refuse)
    response = await proxy.post(body(True), headers)
    assert response.status_code == 200 and response.content == STREAM


async def test_a_stream_cut_before_done_gets_an_error_frame_after_the_bytes_that_came(proxy: Proxy) -> None:
    cut = STREAM[: STREAM.index(b"data: [DONE]")]
    proxy.script.pieces = [cut]
    response = await proxy.post(body(True))
    assert response.status_code == 200 and response.content.startswith(cut)
    data = frames(response.text)
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "stream_truncated"
    (record,) = proxy.records()
    assert record["error"]["code"] == "stream_truncated"


async def test_a_client_leaving_mid_stream_makes_the_proxy_hang_up(proxy: Proxy) -> None:
    proxy.script.loop = asyncio.get_running_loop()
    proxy.script.disconnected = asyncio.Event()
    proxy.script.pieces, proxy.script.gap_s = [b"data: {}\n\n"] * 50, 0.1
    async with httpx.AsyncClient(timeout=10) as http:
        async with http.stream("POST", f"{proxy.url}/v1/chat/completions", json=body(True), headers=OFF) as r:
            async for _ in r.aiter_raw():
                break  # the first piece arrived: leave
    await asyncio.wait_for(proxy.script.disconnected.wait(), 5)  # the upstream saw the proxy hang up
    for _ in range(100):
        if proxy.records():
            break
        await asyncio.sleep(0.02)
    (record,) = proxy.records()
    assert record["disconnected"] is True and record["mode"] == "off"
    metrics = await proxy.metrics()
    assert metric(metrics, "faithproxy_requests_total", mode="off", status="disconnected") == 1
    assert metric(metrics, "faithproxy_client_disconnects_total") == 1


async def test_the_trace_record_has_the_fields_of_any_other_mode(proxy: Proxy) -> None:
    """Off mode writes its own record (no session): the same fields as the full path's."""
    await proxy.post(body(True))
    await proxy.post(body(True), {"x-faithproxy-mode": "detect"})
    off, detect = proxy.records()
    assert (off["mode"], detect["mode"]) == ("off", "detect")
    assert off.keys() == detect.keys()
    assert off["error"] is None and off["timings"]["ttft_s"] is not None and off["stream"] is True


# vLLM's own event streams of the other doors end with their last event and no [DONE].
RESPONSES_STREAM = (
    b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"Red."}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","sequence_number":2}\n\n'
)
MESSAGES_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m1"}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"Red."}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
DOOR_STREAMS = {
    "/v1/responses": (RESPONSES_STREAM, {"model": "m", "input": "hi", "stream": True}),
    "/v1/messages": (
        MESSAGES_STREAM,
        {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    ),
}


@pytest.mark.parametrize("path", DOOR_STREAMS)
async def test_other_doors_streams_end_on_their_own_last_event(proxy: Proxy, path: str) -> None:
    """A complete Responses or Messages stream passes untouched (no [DONE] expected, none added), even with
    its last event split over two reads; one cut before it gets the door's error event."""
    stream, request = DOOR_STREAMS[path]
    split = len(stream) - 20  # inside the last event's name line
    proxy.script.pieces = [stream[:split], stream[split:]]
    async with httpx.AsyncClient(timeout=10) as http:
        whole = await http.post(proxy.url + path, json=request, headers=OFF)
        proxy.script.pieces = [stream[: stream.rindex(b"event: ")]]
        cut = await http.post(proxy.url + path, json=request, headers=OFF)
    assert whole.status_code == 200 and whole.content == stream
    assert cut.content.startswith(proxy.script.pieces[0])
    tail = cut.content[len(proxy.script.pieces[0]) :].decode()
    if path == "/v1/messages":  # Anthropic's error event, which the anthropic SDK raises
        assert tail.startswith("event: error\ndata: ") and "[DONE]" not in tail
        assert json.loads(tail.split("data: ", 1)[1])["error"]["type"] == "api_error"
    else:
        assert json.loads(frames(tail)[0])["error"]["code"] == "stream_truncated"
    first, second = proxy.records()
    assert first["error"] is None and second["error"]["code"] == "stream_truncated"
