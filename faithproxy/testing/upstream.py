"""FakeUpstream: one fake vLLM for tests and benchmarks, reached in process through
`httpx.MockTransport` or served for real (uvicorn on 127.0.0.1) as an ASGI app.

Both entries ask the same pure function (`answer`) what to say, a script's answer with the current
fault applied, and play its steps; only the I/O differs. Routes:

    POST /v1/chat/completions (and /chat/completions)   the script, streamed or not
    POST /v1/completions                                the script (its completions wire), likewise
    GET  /v1/models (and /models), /health
    POST /bench/arm, /bench/release                     holding (answer.Hold): held streams wait
                                                        from arm until release; release answers
                                                        {"released": streams that were waiting}
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from faithproxy.testing.answer import Answer, At, Hold, Pause, Reset, Stall, Step
from faithproxy.testing.faults import Fault, before_answer, faulty_reply, faulty_stream
from faithproxy.testing.scripts import Script, Sentences
from faithproxy.testing.wire import error_body

_NOT_FOUND = Answer.json(404, error_body("not found", "NotFoundError"))
_BAD_JSON = Answer.json(400, error_body("bad json", "BadRequestError"))
_CHAT = ("/v1/chat/completions", "/chat/completions", "/v1/completions")


class UpstreamReset(RuntimeError):
    """Raised inside the served app to make uvicorn drop the connection mid-body."""


class _ClientGone(Exception):
    """A stall saw its client leave: the answer ends there."""


class FakeUpstream:
    """A fake vLLM answering from `script` with `fault` (faults.py) applied to every chat request.

    `requests` records every request received (an `httpx.Request`, whichever entry it came by) unless
    `record` is False (a benchmark's upstream under load); `aborted` counts streams whose client went
    away before their end. Subclasses may override `fault_for` to pick a fault per request.
    """

    def __init__(self, script: Script | None = None, *, fault: Fault = "ok", record: bool = True) -> None:
        self.script: Script = script if script is not None else Sentences()
        self.fault: Fault = fault
        self.record = record
        self.requests: list[httpx.Request] = []
        self.aborted = 0
        self.holding = 0
        self._released = asyncio.Event()  # ends every stall (set it before a server shuts down)
        self._unheld = asyncio.Event()
        self._unheld.set()  # holding is not armed
        models = {"object": "list", "data": [{"id": self.script.model, "object": "model", "owned_by": "fake"}]}
        self._models = Answer.json(200, json.dumps(models).encode())

    # ---- what to say ---------------------------------------------------------------------------

    def fault_for(self, body: dict[str, Any]) -> Fault:
        return self.fault

    def answer(self, method: str, path: str, raw: bytes) -> Answer:
        """The answer to one request (control routes act here: arm and release)."""
        if method == "GET" and path in ("/v1/models", "/models"):
            return self._models
        if method == "GET" and path == "/health":
            return Answer.json(200, b"{}")
        if method == "POST" and path == "/bench/arm":
            self.arm()
            return Answer.json(200, b"{}")
        if method == "POST" and path == "/bench/release":
            held = self.holding
            self.unhold()
            return Answer.json(200, json.dumps({"released": held}).encode())
        if method != "POST" or path not in _CHAT:
            return _NOT_FOUND
        try:
            body = json.loads(raw)
        except ValueError:
            return _BAD_JSON
        if not isinstance(body, dict):
            return _BAD_JSON
        return self.chat(body)

    def chat(self, body: dict[str, Any]) -> Answer:
        fault = self.fault_for(body)
        instead = before_answer(fault)
        if instead is not None:
            return instead
        if body.get("stream") is not True:
            return faulty_reply(fault, self.script.reply(body))
        stream = self.script.stream(body)
        return stream if isinstance(stream, Answer) else faulty_stream(fault, stream)

    # ---- control -------------------------------------------------------------------------------

    def release(self) -> None:
        """End every stall, now and later (call it from the fake's own event loop, e.g. as
        `threaded_app`'s `on_exit`)."""
        self._released.set()

    def arm(self) -> None:
        """Streams that reach a Hold wait there from now until `unhold`."""
        if self._unheld.is_set():
            self._unheld = asyncio.Event()

    def unhold(self) -> None:
        """Held streams go on, and streams that ask to be held from now on are not, until re-armed."""
        self._unheld.set()

    # ---- playing steps -------------------------------------------------------------------------

    async def _pace(self, step: Step, clock: list[float], gone: asyncio.Future[Any] | None) -> None:
        """Carry out one timed step; `clock[0]` is when the last Pause ended (for At)."""
        loop = asyncio.get_running_loop()
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            clock[0] = loop.time()
        elif isinstance(step, At):
            await asyncio.sleep(max(0.0, clock[0] + step.seconds - loop.time()))
        elif isinstance(step, Hold):
            await self._held(step.limit_s)
        elif isinstance(step, Stall):
            await self._stalled(gone)

    async def _held(self, limit_s: float) -> None:
        self.holding += 1
        try:
            await asyncio.wait_for(self._unheld.wait(), limit_s)
        except TimeoutError:
            pass
        finally:
            self.holding -= 1

    async def _stalled(self, gone: asyncio.Future[Any] | None) -> None:
        """Like vLLM: watch for the client going away while nothing is generated."""
        released = asyncio.ensure_future(self._released.wait())
        waiting = {released} if gone is None else {released, gone}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()
        if gone is not None and gone.done():
            self.aborted += 1
            raise _ClientGone

    # ---- served: ASGI --------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.record:
            self.requests.append(_request(scope, raw))
        answer = self.answer(scope["method"], scope["path"], raw)
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await self._serve(answer, send, gone)
        except _ClientGone:
            pass
        except asyncio.CancelledError:
            self.aborted += 1
            raise
        finally:
            gone.cancel()

    async def _serve(self, answer: Answer, send: Any, gone: asyncio.Future[Any]) -> None:
        clock = [asyncio.get_running_loop().time()]
        for step in answer.before:
            await self._pace(step, clock, gone)
        headers = [(b"content-type", answer.content_type.encode())]
        if answer.content_type == "application/json":
            size = sum(len(s) for s in answer.body if isinstance(s, bytes))
            headers.append((b"content-length", str(size).encode()))
        else:
            headers.append((b"cache-control", b"no-cache"))
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        clock[0] = asyncio.get_running_loop().time()
        for step in answer.body:
            if isinstance(step, bytes):
                await send({"type": "http.response.body", "body": step, "more_body": True})
            elif isinstance(step, Reset):
                raise UpstreamReset("the fake upstream dropped the connection")  # uvicorn cuts the body
            else:
                await self._pace(step, clock, gone)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # ---- in process: httpx.MockTransport ---------------------------------------------------------

    async def handle(self, request: httpx.Request) -> httpx.Response:
        """The MockTransport handler (async: use it with an `httpx.AsyncClient`)."""
        raw = await request.aread()
        if self.record:
            self.requests.append(request)
        answer = self.answer(request.method, request.url.path, raw)
        clock = [asyncio.get_running_loop().time()]
        for step in answer.before:
            await self._pace(step, clock, None)
        # A body that arrives as a stream, as from the network: a pass-through can stream it on.
        return httpx.Response(
            answer.status, headers={"content-type": answer.content_type}, stream=_Body(self, answer, request)
        )

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


class _Body(httpx.AsyncByteStream):
    """An answer's body played for a MockTransport response. The proxy cancelling its read is the
    client going: counted in `aborted`, as the served app counts a cancelled answer."""

    def __init__(self, fake: FakeUpstream, answer: Answer, request: httpx.Request) -> None:
        self._fake, self._answer, self._request = fake, answer, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        clock = [asyncio.get_running_loop().time()]
        try:
            for step in self._answer.body:
                if isinstance(step, bytes):
                    yield step
                elif isinstance(step, Reset):
                    message = "peer closed connection without sending complete message body"
                    raise httpx.RemoteProtocolError(message, request=self._request)
                else:
                    await self._fake._pace(step, clock, None)
        except asyncio.CancelledError:
            self._fake.aborted += 1
            raise


async def _disconnected(receive: Any) -> None:
    """Returns once the client has gone (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _request(scope: dict[str, Any], raw: bytes) -> httpx.Request:
    host, port = scope.get("server") or ("127.0.0.1", 80)
    query = scope.get("query_string", b"").decode("latin-1")
    url = f"http://{host}:{port}{scope['path']}" + (f"?{query}" if query else "")
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
    return httpx.Request(scope["method"], url, headers=headers, content=raw)
