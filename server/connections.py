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

The app hands its settings and metrics to the protocol through the ASGI lifespan state (`STATE_KEY`,
yielded by server/app.py's lifespan): uvicorn gives every connection that state. `faithproxy serve`
names this protocol (`HTTP_PROTOCOL`) in one process and in each worker; an app served without it
behaves as plain uvicorn.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from faithproxy.faithcore.errors import RequestTimeout

if TYPE_CHECKING:
    from faithproxy.server.metrics import Metrics
    from faithproxy.server.settings import Settings

STATE_KEY = "faithproxy.connections"
HTTP_PROTOCOL = "faithproxy.server.connections:ConnectionProtocol"  # uvicorn's `http` option, importable


@dataclass(frozen=True, slots=True)
class ConnectionRules:
    """What the protocol reads from the app: the timeouts and where to count a close."""

    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    on_close: Callable[[str], None]  # called with a member of metrics.CONNECTION_CLOSE_REASONS


def timeout_response(reason: str, seconds: float) -> bytes:
    """A whole HTTP/1.1 408 response in OpenAI's error format, closing the connection."""
    part = "headers" if reason == "header_timeout" else "body"
    error = RequestTimeout(f"The request {part} did not arrive within {seconds:g} s.", code=reason)
    body = json.dumps({"error": {"message": error.message, "type": error.error_type, "param": None, "code": reason}})
    head = (
        f"HTTP/1.1 {error.status_code} Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return (head + body).encode()


class ConnectionProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header, body and idle timeouts (see the module's table)."""

    _rules: ConnectionRules | None = None
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        rules = self.app_state.get(STATE_KEY)
        if isinstance(rules, ConnectionRules):
            self._rules = rules
            self.timeout_keep_alive = rules.idle_timeout_s  # type: ignore[assignment]
            self._arm("header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._timer is None:  # the next request on a kept-alive connection: its headers are timed
            self._arm("header_timeout")

    def on_headers_complete(self) -> None:
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


def connection_rules(settings: Settings, metrics: Metrics) -> ConnectionRules:
    """The rules of an app's connections, counting closes in its metrics."""
    counter = metrics.client_connections_closed
    return ConnectionRules(
        header_timeout_s=settings.client_header_timeout_s,
        body_timeout_s=settings.client_body_timeout_s,
        idle_timeout_s=settings.client_idle_timeout_s,
        on_close=lambda reason: counter.labels(reason).inc(),
    )
