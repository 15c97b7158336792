"""No work for a client that left: a request whose client disconnects before its answer has started
is cancelled, whatever the mode and the door; one whose answer has started (a stream) ends itself, as
before, and both are counted.

Without this, a non-streamed request went on to the end after its client had gone: Starlette cancels a
StreamingResponse when the client leaves, but a JSON answer is computed first and sent after, and
uvicorn drops what is sent to a closed connection without a word. The generation, the detector calls
and the regenerations all ran for nobody, holding a concurrency slot and vLLM's batch. In the 30-minute
soak (benchmarks/soak.py, issue 33) clients that gave up after 120 s left 111 requests in flight for 64
clients, and vLLM ran 195. A hostile client could do the same on purpose: send, hang up, repeat.

`serve_while_connected` runs the app in a task of its own beside a watcher that owns the client's
`receive` once the body has been read (ConcurrencyLimitMiddleware reads it first). The app still gets
`http.disconnect` from its own `receive`. When the watcher sees it before the response's last byte,
faithproxy_abandoned_requests_total counts the request, and:
- if the response has not started, the app's task is cancelled (after a short grace): the serving
  code's own cleanup runs (the upstream stream is closed, so vLLM aborts the request; the trace record
  is written in its `finally`);
- if it has started, it is a stream whose own code listens for the disconnect and is cancelling itself
  (Starlette's StreamingResponse, off mode's pass-through). It is not cancelled a second time: a
  second cancellation can cut that cleanup short (server/chain/session.py's `_cancel` explains how).
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

LEAVE_GRACE_S = 1.0  # what a request whose client left before any answer may still run


async def serve_while_connected(app: ASGIApp, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
    """Serves the request whose whole `body` was read from `receive`; cancels it when the client leaves
    before the answer has started. The app's exceptions propagate; its cancellation by us does not."""
    gone = asyncio.Event()
    started = complete = False
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def app_receive() -> Message:
        if pending:
            return pending.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def tracked_send(message: Message) -> None:
        # A stream's middle frames do not pass here (server/protocol/sse.py `body_send`): only its start
        # and its last message, which are all this watches.
        nonlocal started, complete
        started = True
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            complete = True  # before the send: the watcher may wake as soon as it is written
        await send(message)

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass  # nothing else comes after the body (HTTP/1.1 sends no more for this request)
        gone.set()

    serving = asyncio.ensure_future(app(scope, app_receive, tracked_send))
    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({serving, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if gone.is_set() and not started:
            # The client left before any answer. Code that listens for the disconnect gets a moment to
            # end by itself, counting it as its door does.
            await asyncio.wait({serving}, timeout=LEAVE_GRACE_S)
            if not serving.done() and not started:
                serving.cancel()
        await asyncio.wait({serving})
    finally:
        watcher.cancel()
        if not serving.done():  # we are being cancelled ourselves (shutdown): so is the request
            serving.cancel()
    if gone.is_set() and not complete:
        _count_abandoned(scope)
    if not serving.cancelled():
        serving.result()  # the app's own exception, for the middleware outside to answer


def _count_abandoned(scope: Scope) -> None:
    state = getattr(getattr(scope.get("app"), "state", None), "faithproxy", None)
    if state is not None:
        state.metrics.abandoned_requests.inc()
