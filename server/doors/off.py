"""`off` mode as pure ASGI: the client's body bytes to vLLM, vLLM's bytes back, nothing decoded.

`OffModeMiddleware` sits inside the limit middleware (size, API keys, concurrency) and in front of
FastAPI's router. A POST to a door of the app's door table (server/protocol/doors.py) whose mode is
`off` (its X-Faithproxy-Mode header, or the server's default when it has none) is served here: it is
admitted by the one admission path (server/admission/admit.py, as the door's route admits it: the body,
the limits, every X-Faithproxy-* header, media URLs under the image-URL policy), then `Passthrough`
forwards it to the door's vLLM endpoint (`off_path`). Everything else goes on to the router untouched
(a door's route, for a header value the middleware does not read as `off`, answers with the same
`Passthrough`). What this skips is FastAPI's routing and dependency injection, starlette's response
classes, an anyio task group per stream and httpx: most of the CPU a pass-through request cost
(docs/benchmarks.md, issue 22).

A response is what vLLM sent, byte for byte, status and content type included, plus the
X-Faithproxy-Request-Id and X-Faithproxy-Mode headers. A stream that breaks, stalls or ends without
its door's last event (`data: [DONE]`; Responses: a terminal `response.*` event; Messages: `message_stop`)
gets a final error frame in the door's format; an upstream that cannot be reached is an HTTP error in
the door's format. Each request is counted and traced once, like any other, by server/observe/traces.py's
`finish_request` (a record with no session). A request sampled for a shadow check (`Admitted.shadow`)
keeps a reference to each chunk it sends and, once finished, is handed to server/shadow/checker.py, which
checks it later without the client waiting for anything.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from faithproxy.faithcore.errors import FaithproxyError, UpstreamError, UpstreamErrorCode
from faithproxy.server.admission.admit import Admitted, admit, arrival, count_refused
from faithproxy.server.admission.policy import HEADER_MODE
from faithproxy.server.observe.finish import finish_request
from faithproxy.server.observe.traces import RequestTrace
from faithproxy.server.protocol.doors import Api, Door
from faithproxy.server.protocol.errors import anthropic_error_model, door_at, door_error_body, error_frame
from faithproxy.server.protocol.sse import DONE, body_send, event_frame

if TYPE_CHECKING:  # annotations only: importing state.py would load what an off request never uses
    from faithproxy.clients.vllm import UpstreamBody
    from faithproxy.server.state import AppState

_MODE_HEADER = HEADER_MODE.encode()
_END = {"type": "http.response.body", "body": b"", "more_body": False}


def _end_frames(door: Door, exc: FaithproxyError) -> bytes:
    """What ends a stream that broke after its first byte, in the door's format."""
    if door.api is Api.ANTHROPIC:  # an Anthropic `error` event (the SDK raises it); its streams have no [DONE]
        return event_frame("error", anthropic_error_model(exc.status_code, exc.message))
    return error_frame(exc) + DONE


class Passthrough(Response):
    """One off-mode request: an ASGI application that forwards `raw` and sends back what vLLM sends.

    A starlette Response only so that a FastAPI endpoint may return it (the router's off branch does);
    none of Response's own machinery is used.
    """

    # Response.__init__ is not called: it builds a body this class never has.
    def __init__(self, state: AppState, admitted: Admitted, door: Door) -> None:
        self.state = state
        self.admitted = admitted
        self.door = door
        self.path = door.off_path  # vLLM's endpoint for the door's API
        self.ttft: float | None = None
        self.error: FaithproxyError | None = None
        self.disconnected = False
        self.status = 200
        self._finished = False
        self.background = None
        # a request sampled for a shadow check keeps references to what it sends (server/shadow/checker.py)
        self.capture = state.shadow.capture_for(admitted) if admitted.shadow and state.shadow is not None else None

    def _headers(self, upstream_headers: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
        out = [(b"x-faithproxy-request-id", self.admitted.request_id.encode()), (b"x-faithproxy-mode", b"off")]
        content_type = upstream_headers.get("content-type") if upstream_headers is not None else None
        if content_type is not None:
            out.append((b"content-type", content_type.encode("latin-1")))
        return out

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            upstream = await self.state.generator.open_chat(
                self.admitted.raw, stream=self.admitted.stream, path=self.path
            )
        except UpstreamError as exc:
            self.error = exc
            self._finish()
            await self._send_error(send, exc)
            return
        except asyncio.CancelledError:
            self.disconnected = True
            self._finish()
            raise
        except Exception as exc:
            self.error = FaithproxyError(f"internal error: {type(exc).__name__}")
            self._finish()
            raise
        self.status = upstream.status
        try:
            if self.admitted.stream:
                await self._stream(upstream, receive, send, body_send(scope, send))
            else:
                await self._whole(upstream, send)
        finally:
            await upstream.aclose()
            self._finish()

    async def _send_error(self, send: Send, exc: FaithproxyError) -> None:
        await _send_error(send, exc, self._headers({"content-type": "application/json"}), self.door)

    async def _whole(self, upstream: UpstreamBody, send: Send) -> None:
        try:
            content = await upstream.read()
        except UpstreamError as exc:
            self.error = exc
            await self._send_error(send, exc)
            return
        headers = self._headers(upstream.headers)
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        await send({"type": "http.response.body", "body": content, "more_body": False})
        if self.capture is not None:
            self.capture.add(content)

    async def _stream(self, upstream: UpstreamBody, receive: Receive, send: Send, middle: Send) -> None:
        """vLLM's bytes as they come: the start and the last message through `send`, every read between
        through `middle` (the server's own send: server/protocol/sse.py `body_send`)."""
        # vLLM ends every complete event stream with its door's last event (stream_end, else [DONE]): one that
        # ends without it was cut off, and the client must hear so (the door's error frame) rather than take
        # a clean end for a complete answer.
        headers = upstream.headers
        markers = self.door.stream_end or None
        complete = False
        watch_end = (
            upstream.status == 200
            and headers.get("content-type", "").startswith("text/event-stream")
            and headers.get("content-encoding", "identity") == "identity"
        )
        await send({"type": "http.response.start", "status": upstream.status, "headers": self._headers(headers)})
        # The client going away shows only on `receive` (uvicorn drops sends to a closed connection):
        # one task waits for it and cancels this one, which closes the upstream (vLLM aborts).
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.ensure_future(receive())
        watcher.add_done_callback(lambda w: self._on_client_message(w, task))
        tail = b""
        capture = self.capture
        try:
            async for data in upstream.iter_raw():
                if self.ttft is None:
                    self.ttft = time.perf_counter() - self.admitted.started
                    self.state.metrics.ttft.labels("off", self.admitted.endpoint).observe(self.ttft)
                if markers is not None and not complete:  # a marker split over two reads is in tail + data[:32]
                    complete = any(m in data or m in tail + data[:32] for m in markers)
                tail = data if len(data) >= 32 else (tail + data)[-32:]  # the stream's last bytes, uncopied
                await middle({"type": "http.response.body", "body": data, "more_body": True})
                if capture is not None:
                    capture.add(data)
            if markers is None:
                complete = tail.rstrip().endswith(b"data: [DONE]")
            if watch_end and not complete:
                self.error = UpstreamError(
                    "upstream stream ended before its last event", code=UpstreamErrorCode.STREAM_TRUNCATED
                )
                separator = b"" if tail.endswith(b"\n\n") else b"\n\n"
                await self._send_frames(send, separator + _end_frames(self.door, self.error))
        except UpstreamError as exc:  # broke or stalled mid-stream: end well-formed
            self.error = exc
            await self._send_frames(send, _end_frames(self.door, exc))
        except asyncio.CancelledError:
            if not self.disconnected or task.uncancel() > 0:
                raise  # not (only) the client going away: let it through
            return
        finally:
            if not watcher.done():
                watcher.cancel()
        await send(_END)

    def _on_client_message(self, watcher: asyncio.Future[Message], task: asyncio.Task[Any]) -> None:
        if watcher.cancelled() or watcher.exception() is not None:
            return
        if watcher.result().get("type") == "http.disconnect" and not self._finished:
            self.disconnected = True
            task.cancel()

    async def _send_frames(self, send: Send, data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    # ---- accounting ---------------------------------------------------------------------------

    def _finish(self) -> None:
        """Counts the request and writes its trace: runs exactly once, whatever happened."""
        if self._finished:
            return
        self._finished = True
        # A stream's disconnect is counted here, not where the cancellation lands: a send that fails first
        # on the closed socket must not lose the count. A non-streamed request is no stream (the metric's
        # help); its client leaving shows in faithproxy_abandoned_requests_total (server/admission/client_gone.py).
        if self.disconnected and self.admitted.stream:
            self.state.metrics.client_disconnects.inc()
        trace = RequestTrace(self.admitted, self.status, self.ttft, self.error, self.disconnected)
        finish_request(trace, self.state.metrics, self.state.tracer)
        if self.admitted.shadow and self.state.shadow is not None:  # queued or counted, never waited for
            complete = self.error is None and not self.disconnected and 200 <= self.status < 300
            self.state.shadow.submit(self.admitted, self.capture, complete=complete)


class OffModeMiddleware:
    """Serves off-mode chat completions and completions (see the module's docstring); passes everything
    else on."""

    def __init__(self, app: ASGIApp, *, default_off: bool) -> None:
        self.app = app
        self.default_off = default_off

    def _is_off(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == _MODE_HEADER:
                return value.strip().lower() == b"off"  # anything else, valid or not, is the router's
        return self.default_off

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door = door_at(scope) if scope["type"] == "http" else None
        if door is None or scope["method"] != "POST" or not self._is_off(scope["headers"]):
            await self.app(scope, receive, send)
            return
        app = scope.get("app")
        state = getattr(getattr(app, "state", None), "faithproxy", None)
        if state is None:  # no lifespan ran: the router answers as it would
            await self.app(scope, receive, send)
            return
        started = arrival()
        try:
            raw = await _read_body(receive)
            if raw is None:
                return  # the client left before sending its body
            admitted = await admit(raw, Headers(scope=scope), state, door, started=started)
        except FaithproxyError as exc:
            count_refused(state.metrics, exc, door.path)
            await _send_error(send, exc, [(b"content-type", b"application/json")], door)
            return
        await Passthrough(state, admitted, door)(scope, receive, send)


async def _send_error(send: Send, exc: FaithproxyError, headers: list[tuple[bytes, bytes]], door: Door) -> None:
    """The error as one JSON body in the door's format, before any other byte of the response."""
    content = json.dumps(door_error_body(door, exc)).encode()
    headers.append((b"content-length", str(len(content)).encode()))
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": content, "more_body": False})


async def _read_body(receive: Receive) -> bytes | None:
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)
