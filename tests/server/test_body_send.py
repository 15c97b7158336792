"""A stream's middle frames go straight to the server; its start and its end pass every layer.

The layers between uvicorn and a stream (ServerErrorMiddleware, tracing, internal errors, the client-gone
watcher, FastAPI's exception handler) watch only a response's start and its last message
(server/protocol/sse.py `body_send`). A recording layer added like them must see exactly one start and
one last message per streamed request, in every mode, while the client gets every frame: a stream that
sent its start or its end past the layers would fail here, and so would one whose middle frames went
through them."""

from __future__ import annotations

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from faithproxy.server.app import create_app
from faithproxy.server.protocol.sse import BODY_SEND, body_send
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, running_app


class Recording:
    """A pure-ASGI layer that wraps `send` as the watchers do, noting each message it is handed."""

    def __init__(self, app: ASGIApp, seen: list[tuple[str, bool]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return

        async def noted(message: Message) -> None:
            self.seen.append((message["type"], bool(message.get("more_body", False))))
            await send(message)

        await self.app(scope, receive, noted)


@pytest.mark.parametrize("mode", ["off", "detect", "correct"])
async def test_a_layer_sees_the_start_and_the_end_and_the_client_every_frame(mode: str) -> None:
    upstream = FakeUpstream(Sentences())
    settings = Settings(upstream_url="http://vllm.test", default_detector="none", max_tokens_cap=64)
    app = create_app(settings, upstream_transport=upstream.transport())
    seen: list[tuple[str, bool]] = []
    app.add_middleware(Recording, seen=seen)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 32}
    async with running_app(app) as url, httpx.AsyncClient(base_url=url) as client:
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"x-faithproxy-mode": mode}
        ) as response:
            assert response.status_code == 200
            frames = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    assert len(frames) >= 4, frames  # a role chunk, text, an end: there were middle frames to send
    assert seen == [("http.response.start", False), ("http.response.body", False)]


def test_an_app_without_the_servers_send_on_the_scope_streams_through_its_layers() -> None:
    async def layered(message: Message) -> None:
        pass

    async def server(message: Message) -> None:
        pass

    assert body_send({}, layered) is layered
    assert body_send({BODY_SEND: server}, layered) is server
