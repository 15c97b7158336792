"""The last line: an exception that no door, mode or handler turned into an answer.

Every refusal the proxy means to give is a FaithproxyError, answered where it is raised. Anything else
that escapes the app is a bug, and this pure-ASGI middleware (outside every other one but tracing's)
makes it a bug with a trail instead of uvicorn's plain-text "Internal Server Error":

- the client gets a 500 in the door's error format (Anthropic's on /v1/messages, OpenAI's elsewhere),
  code `internal_error`, with the request id in the message and in X-Faithproxy-Request-Id;
- the log gets the traceback with the method, the path and the same request id;
- `faithproxy_internal_errors_total{door}` counts it, so an alert can fire on any of them.

The request id is admission's (server/admission/admit.py notes it in `REQUEST_ID` as it makes it), or a new
one when the request failed before admission. A failure after the response started cannot change its
status: it is logged and counted, and the connection is closed so that the client sees a broken answer
rather than a finished one (uvicorn closes it when the app returns an unfinished response).
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.admission.admit import REQUEST_ID, new_request_id
from faithproxy.server.observe.metrics import NOT_A_DOOR
from faithproxy.server.protocol.doors import Door, DoorTable
from faithproxy.server.protocol.errors import door_at, error_response

log = logging.getLogger("faithproxy")


class InternalErrorMiddleware:
    def __init__(self, app: ASGIApp, doors: DoorTable | None = None) -> None:
        self.app = app
        self.doors = doors  # the door table, for a failure before the app put it on the scope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ids: list[str] = []  # a list, not the id: tasks the app starts copy the context, not the value
        token = REQUEST_ID.set(ids)
        started = False

        async def watch(message: Message) -> None:  # sees a stream's start and end only (sse.py `body_send`)
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # noqa: BLE001 - the point: whatever escaped is answered and counted
            request_id = ids[-1] if ids else new_request_id()
            _record(scope, exc, request_id, started)
            if not started:
                error = FaithproxyError(
                    f"Internal error (request id {request_id}): the proxy failed; the failure is logged.",
                    code="internal_error",
                )
                headers = {"x-faithproxy-request-id": request_id}
                await error_response(error, headers, door=self._door(scope))(scope, receive, send)
        finally:
            REQUEST_ID.reset(token)

    def _door(self, scope: Scope) -> Door | None:
        door = door_at(scope)
        if door is None and self.doors is not None:
            door = self.doors.get(scope.get("path", ""))
        return door


def _record(scope: Scope, exc: Exception, request_id: str, started: bool) -> None:
    path = scope.get("path", "")
    found = door_at(scope)
    door = found.path if found is not None else NOT_A_DOOR
    when = "after the response started" if started else "before any response"
    log.error(
        "internal error %s %s, request id %s, %s: %r",
        scope.get("method"), path, request_id, when, exc, exc_info=exc,
    )  # fmt: skip
    state = getattr(getattr(scope.get("app"), "state", None), "faithproxy", None)
    if state is not None:  # None: the lifespan has not run (a test app without one)
        state.metrics.internal_errors.labels(door).inc()
