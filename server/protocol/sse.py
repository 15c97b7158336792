"""OpenAI chat.completion.chunk construction and SSE framing for the proxy's own streams."""

from __future__ import annotations

import json
import time
from typing import Any

DONE = b"data: [DONE]\n\n"


def frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class ChunkFactory:
    """Builds the chunks of one response: one id, one `created`, one model for all of them."""

    def __init__(self, completion_id: str, model: str) -> None:
        self.id = completion_id
        self.model = model
        self.created = int(time.time())
        self._sent_role = False
        # A plain text delta's frame is this prefix, the delta, this suffix: detect mode sends one per
        # token, and only the delta needs encoding (the bytes equal frame(self.chunk(delta))).
        head = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model}
        self._text_head = frame(head)[: -len(b"}\n\n")] + b',"choices":[{"index":0,"delta":'
        self._text_tail = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def text_frame(self, field: str, text: str) -> bytes:
        """The frame of a chunk whose delta is `{field: text}`, with no finish reason and no extra."""
        if not self._sent_role:
            return frame(self.chunk({field: text}))
        delta = json.dumps({field: text}, ensure_ascii=False, separators=(",", ":")).encode()
        return self._text_head + delta + self._text_tail

    def chunk(
        self, delta: dict[str, Any], *, finish_reason: str | None = None, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        if not self._sent_role:
            delta = {"role": "assistant", **delta}
            self._sent_role = True
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if extra:
            body.update(extra)  # e.g. "faithfulness": the OpenAI SDK keeps unknown fields
        return body

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        }
