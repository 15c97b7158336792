"""POST /v1/messages (Anthropic's Messages API) served by the correction machine.

As for the Responses door (server/doors/responses.py), the request is read as a chat request
(`chat_body`: `system` becomes the system message, text and image blocks, base64 or url, chat content
parts, `max_tokens` stays, `stop_sequences` is `stop`) and driven through vLLM's chat completions by the
chat door's session (`ChatServing`, server/doors/serving.py). The machine's emits become Messages events
(`MessagesEvents`): reasoning text as a `thinking` block (`thinking_delta`), answer text as a `text`
block (`text_delta`), one delta per verified step in `correct`. A step's annotation rides as
`faithfulness` on its delta event, and the summary on `message_delta` and on a non-streamed message;
the anthropic SDK keeps unknown fields. Errors are Anthropic's (`{"type": "error", "error": {...}}`),
before the first byte and as an `error` event after it.

`off` passes vLLM's own /v1/messages through (server/doors/off.py, its refusals and a broken stream's
last event in Anthropic's format too). Tools and non-text, non-image blocks are a 400 in
`detect` and `correct`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi.responses import Response

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.faithcore.types import Channel
from faithproxy.server.chain.session import EmitEnd, EmitExtra, EmitText
from faithproxy.server.doors.serving import ChatServing
from faithproxy.server.protocol.errors import anthropic_error
from faithproxy.server.protocol.sse import ChunkFactory

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


class MessagesEvents(ChunkFactory):
    """The Messages events of one message: content blocks in order (`thinking` for reasoning text,
    `text` for answer text), each started, filled by deltas and stopped."""

    def __init__(self, message_id: str, model: str) -> None:
        self.id = message_id
        self.model = model
        self.created = int(time.time())
        self.blocks = 0  # blocks started so far
        self._open: str | None = None  # the type of the block being written
        self._started = False

    @staticmethod
    def event(kind: str, **fields: Any) -> bytes:
        data = json.dumps({"type": kind, **fields}, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def message(self, content: list[dict[str, Any]], stop_reason: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage.get("prompt_tokens") or 0,
                "output_tokens": usage.get("completion_tokens") or 0,
            },
        }

    def start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [self.event("message_start", message=self.message([], None, {}))]

    def text(self, channel: Channel, text: str, faithfulness: dict[str, Any] | None) -> list[bytes]:
        kind = "thinking" if channel is Channel.REASONING else "text"
        frames = self.start()
        if self._open is not None and self._open != kind:
            frames += self.close()
        if self._open is None:
            self._open = kind
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            frames.append(self.event("content_block_start", index=self.blocks, content_block=block))
            self.blocks += 1
        delta = (
            {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta", "text": text}
        )
        extra = {"faithfulness": faithfulness} if faithfulness else {}
        return [*frames, self.event("content_block_delta", index=self.blocks - 1, delta=delta, **extra)]

    def close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [self.event("content_block_stop", index=self.blocks - 1)]

    def end(
        self, finish_reason: str | None, usage: dict[str, Any], summary: dict[str, Any], extra: dict[str, Any]
    ) -> list[bytes]:
        """The closing events; `extra` rides on message_delta beside `usage` (the judge's bill)."""
        delta = {"stop_reason": _STOP_REASONS.get(finish_reason or "stop", "end_turn"), "stop_sequence": None}
        out_usage = {"output_tokens": usage.get("completion_tokens") or 0}
        return [
            *self.start(),
            *self.close(),
            self.event("message_delta", delta=delta, usage=out_usage, **extra, faithfulness=summary),
            self.event("message_stop"),
        ]


class MessagesServing(ChatServing):
    """Serves one admitted /v1/messages request: the chat door's session and accounting, Messages events
    out, errors in Anthropic's format. `self.body` is the chat body; `self.request` the client's."""

    object_id_prefix = "msg"
    done_frame = b""  # a Messages stream ends on message_stop (or an error event), with no [DONE]

    async def respond(self) -> Response:
        if self.policy.mode == "off":
            return await self._passthrough()
        self.request = self.admitted.request or self.body  # admission translated it to `body`
        return await super().respond()

    def _error_frame(self, exc: FaithproxyError) -> bytes:
        return MessagesEvents.event("error", error=anthropic_error(exc.status_code, exc.message)["error"])

    def _chunks(self) -> ChunkFactory:
        self.events = MessagesEvents(f"{self.object_id_prefix}_{self.request_id}", self.body["model"])
        return self.events

    def _text_frames(self, item: EmitText, step: dict[str, Any] | None, chunks: ChunkFactory) -> list[bytes]:
        return self.events.text(item.channel, item.text, None if step is None else {"step": step})

    def _verdict_frames(self, verdicts: list[dict[str, Any]], chunks: ChunkFactory) -> list[bytes]:
        # on a `ping` event: the SDK skips pings, a raw-SSE client reads them; the summary on
        # message_delta carries every verdict too
        return [*self.events.start(), self.events.event("ping", faithfulness={"verdicts": verdicts})]

    def _extra_frames(self, item: EmitExtra, chunks: ChunkFactory) -> list[bytes]:
        return []  # tool calls and the like: refused before the chain started

    def _end_frames(self, item: EmitEnd, chunks: ChunkFactory) -> list[bytes]:
        assert self.session is not None
        usage = dict(self.session.result().usage)
        return self.events.end(item.finish_reason, usage, self._summary(), self._judge_usage())

    def _body(self, finish_reason: str | None, extras: dict[str, Any]) -> dict[str, Any]:
        assert self.session is not None
        events = MessagesEvents(f"{self.object_id_prefix}_{self.request_id}", self.body["model"])
        content: list[dict[str, Any]] = []
        thinking = self.answer.get("reasoning") or self.answer.get("reasoning_content")
        if thinking:
            content.append({"type": "thinking", "thinking": thinking, "signature": ""})
        content.append({"type": "text", "text": self.answer.get("content", "")})
        stop = _STOP_REASONS.get(finish_reason or "stop", "end_turn")
        message = events.message(content, stop, dict(self.session.result().usage))
        return {**message, **self._judge_usage(), "faithfulness": self._summary()}
