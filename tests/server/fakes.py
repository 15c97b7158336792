"""Stand-ins for vLLM shared by the server tests: an httpx.MockTransport handler (unit level) and a
real uvicorn app with fault modes (the fault matrix). Both speak just enough of the OpenAI API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from faithproxy.benchmarks.standins.local_server import running_app

SENTENCES = ["The image shows a red circle. ", "It is on a white background. ", "So the answer is red."]


def sse(*objs: object, done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)
    return out + (b"data: [DONE]\n\n" if done else b"")


def delta(text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "u1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }


def usage_chunk() -> dict[str, Any]:
    return {
        "id": "u1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3},
    }


def completion(text: str) -> dict[str, Any]:
    return {
        "id": "u1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def streamed(status: int, body: bytes, content_type: str) -> httpx.Response:
    """A response whose body arrives as a stream, as from the network (MockTransport hands a response
    built from bytes over already read, and a pass-through of it could not stream it again)."""

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    return httpx.Response(status, content=chunks(), headers={"content-type": content_type})


def frames(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]


@dataclass
class MockVLLM:
    """A healthy vLLM behind httpx.MockTransport; records every request it receives."""

    sentences: list[str] = field(default_factory=lambda: list(SENTENCES))
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "not found", "type": "NotFoundError"}})
        try:
            body = json.loads(request.content)
        except ValueError:
            return httpx.Response(400, json={"error": {"message": "bad json", "type": "BadRequestError"}})
        stream = isinstance(body, dict) and body.get("stream") is True
        if stream:
            chunks = [delta(s) for s in self.sentences[:-1]] + [delta(self.sentences[-1], "stop"), usage_chunk()]
            return streamed(200, sse(*chunks), "text/event-stream")
        return httpx.Response(200, json=completion("".join(self.sentences)))

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


VLLMFault = Literal["ok", "die_mid_stream", "stall_mid_stream", "stall_before_headers", "malformed_sse", "http_500"]


def fault_vllm_app() -> FastAPI:
    """A fake vLLM served for real (uvicorn on 127.0.0.1) whose streams fail on demand.

    `app.state.fault` picks the failure; `app.state.release` ends every stall (set it before shutdown);
    `app.state.aborted` counts streams whose client (the proxy) went away before their end.
    """
    app = FastAPI()
    app.state.fault = "ok"
    app.state.release = asyncio.Event()
    app.state.aborted = 0
    app.state.repeat = 1  # "ok" streams send the middle sentence this many times (long streams)
    app.state.gap_s = 0.0  # ... with this pause before each

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "m", "object": "model"}]}

    @app.get("/health")
    async def health() -> Response:
        return Response()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        fault = app.state.fault
        if fault == "http_500":
            return JSONResponse({"error": {"message": "injected", "type": "InternalServerError"}}, status_code=500)
        if fault == "stall_before_headers":
            await app.state.release.wait()
            return JSONResponse({"error": {"message": "released", "type": "x"}}, status_code=503)
        if not body.get("stream"):
            if fault == "malformed_sse":
                return PlainTextResponse("{not json", media_type="application/json")
            return JSONResponse(completion("".join(SENTENCES)))

        async def events() -> Any:
            try:
                yield sse(delta(SENTENCES[0]), delta(SENTENCES[1]), done=False)
                if fault == "die_mid_stream":
                    raise RuntimeError("vLLM died")  # uvicorn drops the connection without the final chunk
                if fault == "stall_mid_stream":
                    # Like vLLM: watch for the client going away while nothing is generated.
                    while not app.state.release.is_set():
                        if await request.is_disconnected():
                            app.state.aborted += 1
                            return
                        await asyncio.sleep(0.02)
                    return
                if fault == "malformed_sse":
                    yield b'data: {"choices": [{"index": 0, "delta": {"content": "cut\n\ndata: [DONE]\n\n'
                    return
                for _ in range(app.state.repeat - 1):
                    await asyncio.sleep(app.state.gap_s)
                    yield sse(delta(SENTENCES[1]), done=False)
                yield sse(delta(SENTENCES[2], "stop"), usage_chunk())
            except asyncio.CancelledError:
                app.state.aborted += 1
                raise

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        sample_labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(sample_labels.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextlib.contextmanager
def threaded_app(app: Any, on_exit: Callable[[], None] | None = None) -> Iterator[str]:
    """Serves `app` (uvicorn on 127.0.0.1) from its own thread and event loop; yields its URL.

    The test's loop then holds only the proxy's tasks, so a task leak of the proxy cannot hide among
    (or be confused with) the tasks of a fake server that is deliberately stalling.
    """
    started = threading.Event()
    urls: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []
    stop: list[asyncio.Event] = []
    errors: list[BaseException] = []

    async def serve() -> None:
        stop.append(asyncio.Event())
        loops.append(asyncio.get_running_loop())
        async with running_app(app, on_exit=on_exit) as url:
            urls.append(url)
            started.set()
            await stop[0].wait()

    def main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)
            started.set()

    thread = threading.Thread(target=main, name="fake-server", daemon=True)
    thread.start()
    started.wait(30)
    if errors or not urls:
        raise RuntimeError("fake server did not start") from (errors[0] if errors else None)
    try:
        yield urls[0]
    finally:
        loops[0].call_soon_threadsafe(stop[0].set)
        thread.join(30)
