"""FaithproxyError → error bodies in the door's format, HTTP responses, and final SSE error frames.

Every door answers in its API's error format, whoever refuses the request: the door itself, admission,
FastAPI's validation, or the pure-ASGI middleware in front (size 413/431, API key 401, concurrency 429,
client timeouts 408). OpenAI's `{"error": {message, type, param, code}}` everywhere but /v1/messages,
which gets Anthropic's `{"type": "error", "error": {type, message}}` (the anthropic SDK raises its typed
errors from that `type`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.types import Receive, Scope, Send

from faithproxy.faithcore.errors import FaithproxyError, PolicyError, UpstreamStatusError
from faithproxy.server.protocol.doors import Api, Door, DoorTable

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error body, also the data of the `error` event that ends a stream broken after its
    first byte."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


def anthropic_error_model(status: int, message: str) -> AnthropicErrorResponse:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return AnthropicErrorResponse(error=AnthropicErrorDetail(type=kind, message=message))


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    return anthropic_error_model(status, message).model_dump()


def _where(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as a client reads it: messages[0].content."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def invalid_body(exc: ValidationError, model: type[BaseModel]) -> PolicyError:
    """A door's request model refusing a body, as the 400 every door answers in its own format: `param`
    the top-level field, the message where and why. Several errors under one location are the shapes of
    a union none of which fits: their reasons are joined, then the field's description, which says what fits."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    for error in errors:  # "a valid dictionary or instance of ChatMessage": the class is no client's business
        error["msg"] = error["msg"].split(" or instance of ")[0]
    loc = errors[0]["loc"]
    field = str(loc[0]) if loc else None
    if errors[0]["type"] == "missing":
        return PolicyError(f"'{_where(loc)}' is required", param=field)
    shapes = [e for e in errors if e["loc"][:1] == loc[:1]]
    if len(shapes) == 1:
        return PolicyError(f"Invalid '{_where(loc)}': {errors[0]['msg']}", param=field)
    common = loc
    for other in shapes[1:]:
        n = next((i for i, (a, b) in enumerate(zip(common, other["loc"], strict=False)) if a != b), len(common))
        common = common[: min(n, len(other["loc"]))]
    reasons = "; ".join(dict.fromkeys(e["msg"] for e in shapes))
    info = model.model_fields.get(field or "") if len(common) == 1 else None
    expected = f". {info.description}" if info is not None and info.description else ""
    return PolicyError(f"Invalid '{_where(common)}': {reasons}{expected}", param=field)


def error_body(exc: FaithproxyError) -> dict[str, Any]:
    if isinstance(exc, UpstreamStatusError) and isinstance(exc.body, dict) and "error" in exc.body:
        # vLLM's own OpenAI-format error is already what the client expects: pass it on.
        return exc.body
    detail = ErrorDetail(message=exc.message, type=exc.error_type, param=exc.param, code=exc.code)
    return ErrorResponse(error=detail).model_dump()


def door_error_body(door: Door | None, exc: FaithproxyError) -> dict[str, Any]:
    """The error body in the format of `door` (OpenAI's for a path that is no door: /metrics, /reports)."""
    if door is not None and door.api is Api.ANTHROPIC:
        return anthropic_error(exc.status_code, exc.message)
    return error_body(exc)


def error_response(
    exc: FaithproxyError, headers: dict[str, str] | None = None, *, door: Door | None = None
) -> JSONResponse:
    return JSONResponse(door_error_body(door, exc), status_code=exc.status_code, headers=headers)


def doors_of(app: Any) -> DoorTable | None:
    """The door table `create_app` keeps on the app (None for an app that is not faithproxy's)."""
    return getattr(getattr(app, "state", None), "doors", None)


def door_at(scope: Scope) -> Door | None:
    """The door a request's scope is for, None when its path is no door."""
    doors = doors_of(scope.get("app"))
    return doors.get(scope.get("path", "")) if doors is not None else None


async def send_error(
    scope: Scope, receive: Receive, send: Send, exc: FaithproxyError, headers: dict[str, str] | None = None
) -> None:
    """Answers from pure ASGI middleware (auth, limits) in the door's format and counts the request as
    rejected."""
    state = getattr(getattr(scope.get("app"), "state", None), "faithproxy", None)
    door = door_at(scope)
    if state is not None and door is not None:
        state.metrics.requests.labels("rejected", "-", f"{exc.status_code // 100}xx", door.path).inc()
    await error_response(exc, headers=headers, door=door)(scope, receive, send)


def error_frame(exc: FaithproxyError) -> bytes:
    """The last frame of a stream that failed after its first byte (followed by `data: [DONE]`)."""
    return b"data: " + json.dumps(error_body(exc)).encode() + b"\n\n"


async def faithproxy_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FaithproxyError)
    return error_response(exc, door=door_at(request.scope))


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = _where(tuple(p for p in first.get("loc", ()) if p != "body"))
    message = f"Invalid request body: {first.get('msg', 'validation error')}" + (f" at '{loc}'" if loc else "")
    door = door_at(request.scope)
    if door is not None and door.api is Api.ANTHROPIC:
        return JSONResponse(anthropic_error(400, message), status_code=400)
    body = ErrorResponse(error=ErrorDetail(message=message, type="invalid_request_error", param=loc or None))
    return JSONResponse(body.model_dump(), status_code=400)
