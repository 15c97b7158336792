"""POST /v1/responses (OpenAI's Responses API) served by the correction machine.

The Responses API offers no way to continue a partial message, so in `detect` and `correct` the request
is read as a chat request (`chat_body`: `instructions` become the system message, `input` items the
messages, `input_image` parts image_url parts, `max_output_tokens` the max_tokens) and driven through
vLLM's chat completions exactly as the chat door drives it (`ChatServing`, server/doors/serving.py); only
the rendering differs: the machine's emits become Responses events (`ResponsesEvents`): reasoning text
as a `reasoning` item (`response.reasoning_text.delta`), answer text as a `message` item
(`response.output_text.delta`), one delta per verified step in `correct`. A step's annotation rides as
`faithfulness` on its delta event and the summary on the final response; the openai SDK keeps unknown
fields, so its typed events still parse. `off` passes vLLM's own /v1/responses through
(server/doors/off.py).

What a stateless verified chain cannot do (`previous_response_id`, `conversation`, `store`,
`background`, tools, non-message input items) is a 400 in `detect` and `correct` naming it, and that
`off` passes it through.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi.responses import Response

from faithproxy.faithcore.types import Channel
from faithproxy.server.chain.session import EmitEnd, EmitExtra, EmitText
from faithproxy.server.doors.serving import ChatServing
from faithproxy.server.protocol.sse import ChunkFactory


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


class ResponsesEvents(ChunkFactory):
    """The Responses objects and events of one response: output items in order (a `reasoning` item for
    reasoning text, a `message` item for answer text), each opened, filled by deltas and closed."""

    def __init__(self, response_id: str, model: str, request: dict[str, Any]) -> None:
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.request = request
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items, closed ones final
        self._open: dict[str, Any] | None = None  # the item being written
        self._started = False

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def response(self, status: str, **extra: Any) -> dict[str, Any]:
        body = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "output": list(self.output),
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {},
            "parallel_tool_calls": False,
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "tool_choice": "none",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            **extra,
        }

    def start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [
            self.event("response.created", response=self.response("in_progress")),
            self.event("response.in_progress", response=self.response("in_progress")),
        ]

    def text(self, channel: Channel, text: str, faithfulness: dict[str, Any] | None) -> list[bytes]:
        kind = "reasoning" if channel is Channel.REASONING else "message"
        frames = self.start()
        if self._open is not None and self._open["type"] != kind:
            frames += self.close()
        if self._open is None:
            frames += self._open_item(kind)
        item = self._open
        assert item is not None
        item["_text"] += text
        extra = {"faithfulness": faithfulness} if faithfulness else {}
        where = {"item_id": item["id"], "output_index": len(self.output), "content_index": 0}
        if kind == "reasoning":
            return [*frames, self.event("response.reasoning_text.delta", **where, delta=text, **extra)]
        return [*frames, self.event("response.output_text.delta", **where, delta=text, logprobs=[], **extra)]

    def _open_item(self, kind: str) -> list[bytes]:
        index = len(self.output)
        if kind == "reasoning":
            self._open = {"type": "reasoning", "id": f"rs_{self.id}_{index}", "_text": ""}
            item = {"type": "reasoning", "id": self._open["id"], "summary": [], "content": [], "status": "in_progress"}
            return [self.event("response.output_item.added", output_index=index, item=item)]
        self._open = {"type": "message", "id": f"msg_{self.id}_{index}", "_text": ""}
        item = {"type": "message", "id": self._open["id"], "role": "assistant", "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": self._open["id"], "output_index": index, "content_index": 0}
        return [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event("response.content_part.added", **where, part=part),
        ]

    def close(self) -> list[bytes]:
        """Ends the item being written: its done events, and the item joins `output`."""
        item, self._open = self._open, None
        if item is None:
            return []
        index, text = len(self.output), item["_text"]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        final = self.item(item["type"], item["id"], text)
        self.output.append(final)
        if item["type"] == "reasoning":
            return [
                self.event("response.reasoning_text.done", **where, text=text),
                self.event("response.output_item.done", output_index=index, item=final),
            ]
        part = final["content"][0]
        return [
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=index, item=final),
        ]

    @staticmethod
    def item(kind: str, item_id: str, text: str) -> dict[str, Any]:
        if kind == "reasoning":
            content = [{"type": "reasoning_text", "text": text}]
            return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": "completed"}
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {"type": "message", "id": item_id, "role": "assistant", "status": "completed", "content": [part]}

    def final(self, finish_reason: str | None, usage: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
        """The finished response object: `incomplete` when the token budget ended it."""
        if finish_reason == "length":
            extra = {"incomplete_details": {"reason": "max_output_tokens"}}
            return self.response("incomplete", usage=_usage(usage), faithfulness=summary, **extra)
        return self.response("completed", usage=_usage(usage), faithfulness=summary)


class ResponsesServing(ChatServing):
    """Serves one admitted /v1/responses request: the chat door's session and accounting, Responses
    events out. `self.body` is the chat body the session drives vLLM with; `self.request` the client's."""

    object_id_prefix = "resp"
    done_frame = b""  # a Responses stream ends on its terminal event, with no [DONE] (as vLLM's own)

    async def respond(self) -> Response:
        if self.policy.mode == "off":
            return await self._passthrough()
        self.request = self.admitted.request or self.body  # admission translated it to `body`
        return await super().respond()

    def _chunks(self) -> ChunkFactory:
        self.events = ResponsesEvents(f"{self.object_id_prefix}_{self.request_id}", self.body["model"], self.request)
        return self.events

    def _text_frames(self, item: EmitText, step: dict[str, Any] | None, chunks: ChunkFactory) -> list[bytes]:
        return self.events.text(item.channel, item.text, None if step is None else {"step": step})

    def _verdict_frames(self, verdicts: list[dict[str, Any]], chunks: ChunkFactory) -> list[bytes]:
        verdict_event = self.events.event("response.faithfulness.verdicts", faithfulness={"verdicts": verdicts})
        return [*self.events.start(), verdict_event]

    def _extra_frames(self, item: EmitExtra, chunks: ChunkFactory) -> list[bytes]:
        return []  # tool calls and the like: refused before the chain started

    def _end_frames(self, item: EmitEnd, chunks: ChunkFactory) -> list[bytes]:
        assert self.session is not None
        events = self.events
        frames = [*events.start(), *events.close()]
        final = events.final(item.finish_reason, dict(self.session.result().usage), self._summary())
        final.update(self._judge_usage())  # the judge's bill beside `usage` (server/chain/judge_bill.py)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*frames, events.event(kind, response=final)]

    def _body(self, finish_reason: str | None, extras: dict[str, Any]) -> dict[str, Any]:
        assert self.session is not None
        events = ResponsesEvents(f"{self.object_id_prefix}_{self.request_id}", self.body["model"], self.request)
        events.created = int(self.started_wall)
        reasoning = self.answer.get("reasoning") or self.answer.get("reasoning_content")
        if reasoning:
            events.output.append(events.item("reasoning", f"rs_{events.id}_0", reasoning))
        events.output.append(
            events.item("message", f"msg_{events.id}_{len(events.output)}", self.answer.get("content", ""))
        )
        return {
            **events.final(finish_reason, dict(self.session.result().usage), self._summary()),
            **self._judge_usage(),
        }
