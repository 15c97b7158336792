"""The client side of a connection: how long a client may take to send a request, and how long an
idle keep-alive connection stays open.

uvicorn reads requests with httptools and puts no limit on how long the headers or the body take: a
client that sends a few bytes and stalls holds its connection (and, before the concurrency limit
counted only requests whose body had arrived, a concurrency slot) for ever. `ConnectionProtocol` is
uvicorn's httptools protocol with three timers, one armed at a time:

    timer    runs from                              until                 on expiry                 reason
    header   the connection is made, or the first   the headers are in    408, then close           header_timeout
             byte of the next request arrives
    body     the headers are in                     the last body byte    408 if no response has    body_timeout
                                                                          started, then close
    idle     a response is complete (keep-alive)    the next byte         close (uvicorn's timer)   idle_timeout

The body timer bounds the whole body, not the gap between two reads: a client that drips one byte a
second is as stalled as one that sends nothing. A 408 is an OpenAI-format error with
`Connection: close`; the request's app sees the client as gone (http.disconnect). Each close is
counted in faithproxy_client_connections_closed_total{reason}.

With `max_connections_per_client`, an address's connections beyond that many get their first request
answered 429 (`too_many_connections`, Retry-After) and are closed: counted per address, since the API
key is not known when a connection opens (requests in flight are limited per API key in
server/admission/limits.py).

The app hands its settings and metrics to the protocol through the ASGI lifespan state (`STATE_KEY`,
yielded by server/app.py's lifespan): uvicorn gives every connection that state. `faithproxy serve`
names this protocol (`HTTP_PROTOCOL`) in one process and in each worker; an app served without it
behaves as plain uvicorn.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from faithproxy.faithcore.errors import Overloaded, RequestTimeout
from faithproxy.server.admission import refusals
from faithproxy.server.protocol.errors import error_body

if TYPE_CHECKING:
    from faithproxy.server.observe.metrics import Metrics
    from faithproxy.server.settings import Settings

STATE_KEY = "faithproxy.connections"
HTTP_PROTOCOL = "faithproxy.server.admission.connections:ConnectionProtocol"  # uvicorn's `http` option, importable


@dataclass(frozen=True, slots=True)
class ConnectionRules:
    """What the protocol reads from the app: the timeouts and where to count a close."""

    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    on_close: Callable[[str], None]  # called with a member of metrics.CONNECTION_CLOSE_REASONS
    max_connections_per_client: int | None = None  # per address (the API key is not known yet)
    retry_after_s: int = 1
    open: Counter[str] = field(default_factory=Counter)  # open connections per address


def timeout_response(reason: str, seconds: float) -> bytes:
    """A whole HTTP/1.1 408 response in OpenAI's error format, closing the connection."""
    part = "headers" if reason == "header_timeout" else "body"
    error = RequestTimeout(f"The request {part} did not arrive within {seconds:g} s.", code=reason)
    body = json.dumps(error_body(error))
    head = (
        f"HTTP/1.1 {error.status_code} Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return (head + body).encode()


class ConnectionProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header, body and idle timeouts (see the module's table)."""

    _rules: ConnectionRules | None = None
    _timer: asyncio.TimerHandle | None = None
    _address: str | None = None  # counted in rules.open while this connection is open
    _over_limit = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        rules = self.app_state.get(STATE_KEY)
        if isinstance(rules, ConnectionRules):
            self._rules = rules
            self.timeout_keep_alive = rules.idle_timeout_s  # type: ignore[assignment]
            self._arm("header_timeout")
            if rules.max_connections_per_client is not None:
                self._address = self.client[0] if self.client else "-"
                rules.open[self._address] += 1
                self._over_limit = rules.open[self._address] > rules.max_connections_per_client

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._rules is not None and self._address is not None:
            open_ = self._rules.open
            open_[self._address] -= 1
            if not open_[self._address]:
                del open_[self._address]
            self._address = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._timer is None:  # the next request on a kept-alive connection: its headers are timed
            self._arm("header_timeout")

    def on_headers_complete(self) -> None:
        if self._over_limit and self._rules is not None:  # answered 429 by too_many_connections, then closed
            self._rules.on_close("too_many_connections")
            real, self.app = self.app, too_many_connections(self._rules)
            try:
                super().on_headers_complete()
            finally:
                self.app = real
            self.cycle.keep_alive = False
        else:
            super().on_headers_complete()
        self._disarm()
        if self.pipeline and self.pipeline[0][0] is self.cycle:
            return  # a pipelined request is not read until the one before it is answered: not timed
        self._arm("body_timeout")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def timeout_keep_alive_handler(self) -> None:
        if self._rules is not None and not self.transport.is_closing():
            self._rules.on_close("idle_timeout")
        super().timeout_keep_alive_handler()

    def _arm(self, reason: str) -> None:
        rules = self._rules
        if rules is None:
            return
        self._disarm()
        seconds = rules.header_timeout_s if reason == "header_timeout" else rules.body_timeout_s
        self._timer = self.loop.call_later(seconds, self._expire, reason, seconds)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, reason: str, seconds: float) -> None:
        self._timer = None
        if self.transport.is_closing() or self._rules is None:
            return
        self._rules.on_close(reason)
        cycle = self.cycle
        if reason == "header_timeout":
            answer = cycle is None or cycle.response_complete  # not while an earlier response is being sent
        else:
            answer = cycle is not None and not cycle.response_started
        if answer:
            self.transport.write(timeout_response(reason, seconds))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() says http.disconnect, its send() is dropped
            cycle.message_event.set()
        self.transport.close()


def too_many_connections(rules: ConnectionRules) -> ASGI3Application:
    """The app that answers a request on a connection beyond its address's limit: 429 + Retry-After."""
    retry = rules.retry_after_s
    limit = rules.max_connections_per_client
    message = f"Too many connections from this address (limit {limit}); retry after {retry} s."
    error = Overloaded(message, retry_after_s=retry, code="too_many_connections")
    body = json.dumps(error_body(error))

    async def answer(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"retry-after", str(retry).encode())]
        await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})  # then closed: no keep-alive

    return answer  # type: ignore[return-value]


# The closes that refuse a request, with the status they answer (an idle keep-alive refuses nothing).
_REFUSED_WITH = {"header_timeout": 408, "body_timeout": 408, "too_many_connections": 429}


def connection_rules(settings: Settings, metrics: Metrics) -> ConnectionRules:
    """The rules of an app's connections, counting closes in its metrics."""
    counter = metrics.client_connections_closed

    def on_close(reason: str) -> None:
        counter.labels(reason).inc()
        status = _REFUSED_WITH.get(reason)
        if status is not None:  # the request was refused too (faithproxy_refusals_total), at no door yet
            refusals.count(metrics, status, None)

    return ConnectionRules(
        header_timeout_s=settings.client_header_timeout_s,
        body_timeout_s=settings.client_body_timeout_s,
        idle_timeout_s=settings.client_idle_timeout_s,
        on_close=on_close,
        max_connections_per_client=settings.max_connections_per_client,
        retry_after_s=settings.retry_after_s,
    )
