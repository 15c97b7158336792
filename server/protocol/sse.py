"""SSE framing of the proxy's own streams: a wire model as one `data:` frame, or as a named event.

Each door's renderer builds its frames from its response models (server/doors/); its per-token frames
are serialized from a model once with `TEXT_MARKER` as the text, split there, and only the text is
encoded per token.
"""

from __future__ import annotations

from pydantic import BaseModel

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
