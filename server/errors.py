"""FaithproxyError → OpenAI error bodies, HTTP responses, and final SSE error frames."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from faithproxy.faithcore.errors import FaithproxyError, UpstreamStatusError

# The doors (server/routers/): a refusal by the middleware in front of them counts as a rejected request.
_DOOR_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})


def error_body(exc: FaithproxyError) -> dict[str, Any]:
    if isinstance(exc, UpstreamStatusError) and isinstance(exc.body, dict) and "error" in exc.body:
        # vLLM's own OpenAI-format error is already what the client expects: pass it on.
        return exc.body
    return {"error": {"message": exc.message, "type": exc.error_type, "param": exc.param, "code": exc.code}}


def error_response(exc: FaithproxyError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status_code, headers=headers)


async def send_error(
    scope: Scope, receive: Receive, send: Send, exc: FaithproxyError, headers: dict[str, str] | None = None
) -> None:
    """Answers from pure ASGI middleware (auth, limits) and counts the request as rejected."""
    app = scope.get("app")
    state = getattr(getattr(app, "state", None), "faithproxy", None)
    if state is not None and scope.get("path") in _DOOR_PATHS:
        state.metrics.requests.labels("rejected", "-", f"{exc.status_code // 100}xx").inc()
    await error_response(exc, headers=headers)(scope, receive, send)


def error_frame(exc: FaithproxyError) -> bytes:
    """The last frame of a stream that failed after its first byte (followed by `data: [DONE]`)."""
    return b"data: " + json.dumps(error_body(exc)).encode() + b"\n\n"


async def faithproxy_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FaithproxyError)
    return error_response(exc)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = f"Invalid request body: {first.get('msg', 'validation error')}" + (f" at '{loc}'" if loc else "")
    body = {"error": {"message": message, "type": "invalid_request_error", "param": loc or None, "code": None}}
    return JSONResponse(body, status_code=400)
