"""SSE framing of the proxy's own streams: a wire model as one `data:` frame, or as a named event.

Each door's renderer builds its frames from its response models (server/doors/); its per-token frames
are serialized from a model once with `TEXT_MARKER` as the text, split there, and only the text is
encoded per token.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Scope, Send

DONE = b"data: [DONE]\n\n"
# A noncharacter no model writes: where a template's text goes. Its JSON is itself, quoted (no escape).
TEXT_MARKER = "\ufdd0"
TEXT_MARKER_JSON = b'"' + TEXT_MARKER.encode() + b'"'


def data_frame(model: BaseModel) -> bytes:
    """`data: {json}` and the blank line: an OpenAI stream's frame."""
    return b"data: " + model.__pydantic_serializer__.to_json(model) + b"\n\n"


def event_frame(kind: str, model: BaseModel) -> bytes:
    """`event: kind`, `data: {json}` and the blank line: a Responses or Messages event."""
    return b"event: " + kind.encode() + b"\ndata: " + model.__pydantic_serializer__.to_json(model) + b"\n\n"


# ---- the middle of a stream, straight to the server ----------------------------------------------
# Every layer between the server and a stream wraps `send` to watch a response's start (its status, that
# it started) and its last message (that it ended): the app's ServerErrorMiddleware, tracing
# (server/observe/otel.py), internal errors (server/runtime/internal_errors.py), the client-gone watcher
# (server/admission/client_gone.py) and FastAPI's own exception handler. None reads the frames between,
# yet each frame paid a coroutine per layer: most of what a streamed token costs beside the socket write
# in off and detect mode, which send one frame per vLLM frame. So the app puts the server's own `send`
# on the scope (server/app.py `FaithproxyApp`), and a stream sends its start and its last message through
# the layers and its middle frames to the server directly. A layer that must see or change every frame
# (a compressing middleware, say) takes BODY_SEND off the scope before calling on: the frames then pass it.
# tests/server/test_body_send.py holds the rule for the layers there are.
BODY_SEND = "faithproxy.body_send"


def body_send(scope: Scope, send: Send) -> Send:
    """The `send` for a stream's middle frames (`more_body` true, after the start): the server's own when
    the app put it on the scope, else `send` (an app assembled without FaithproxyApp)."""
    direct: Send | None = scope.get(BODY_SEND)
    return direct if direct is not None else send


class FramesResponse(StreamingResponse):
    """Starlette's StreamingResponse whose middle frames go straight to the server (`body_send`); its
    start and its last message pass every layer, as StreamingResponse's do."""

    _middle: Send | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Send) -> None:
        self._middle = body_send(scope, send)
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        middle = self._middle or send
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            if not isinstance(chunk, bytes | memoryview):
                chunk = chunk.encode(self.charset)
            await middle({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
