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

from fastapi.responses import JSONResponse, Response

from faithproxy.faithcore.errors import FaithproxyError, PolicyError
from faithproxy.faithcore.types import Channel
from faithproxy.server.admission.image_urls import settle_media_urls
from faithproxy.server.admission.limits import MESSAGES_PATH, check_body
from faithproxy.server.chain.session import EmitEnd, EmitExtra, EmitText
from faithproxy.server.doors.serving import ChatServing
from faithproxy.server.protocol.errors import anthropic_error
from faithproxy.server.protocol.sse import ChunkFactory

_UNSUPPORTED = ("tools", "tool_choice", "mcp_servers", "container")
_PASSED_ON = ("temperature", "top_p", "top_k", "seed")
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def _block(block: Any, where: str) -> dict[str, Any]:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    source = block.get("source") if kind == "image" else None
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") if isinstance(source.get("media_type"), str) else "image/png"
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{source['data']}"}}
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise PolicyError(
        f"{where}: only text and image (base64, url) blocks are supported outside X-Faithproxy-Mode: off",
        param="messages",
    )


def _message(message: dict[str, Any], index: int) -> dict[str, Any]:
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise PolicyError(f"messages[{index}].role must be 'user' or 'assistant'", param="messages")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise PolicyError(f"messages[{index}].content must be a string or a list of blocks", param="messages")
    # An earlier turn's thinking, sent back by the client, is the assistant message's `reasoning` (as vLLM's
    # own /v1/messages maps it; the chat template decides whether past thinking is rendered). A
    # redacted_thinking block holds nothing a template could render: left out.
    thinking = [b for b in content if isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")]
    if thinking and role != "assistant":
        raise PolicyError(f"messages[{index}]: thinking blocks belong to assistant messages", param="messages")
    blocks = [
        _block(b, f"messages[{index}].content[{i}]")
        for i, b in enumerate(content)
        if not (isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking"))
    ]
    out: dict[str, Any] = {"role": role, "content": blocks}
    reasoning = "".join(b["thinking"] for b in thinking if isinstance(b.get("thinking"), str))
    if reasoning:
        out["reasoning"] = reasoning
    return out


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    texts = [b.get("text") for b in system if isinstance(b, dict)]
    if not all(isinstance(t, str) for t in texts) or len(texts) != len(system):
        raise PolicyError("'system' blocks must be text blocks", param="system")
    return "\n".join(texts)  # type: ignore[arg-type]


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The Messages request as the chat request vLLM is driven with (a PolicyError for what has none)."""
    messages = [_message(m, i) for i, m in enumerate(body["messages"])]
    if body.get("system"):
        messages.insert(0, {"role": "system", "content": _system_text(body["system"])})
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    chat["stream"] = bool(body.get("stream"))
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    for name in _PASSED_ON:
        if body.get(name) is not None:
            chat[name] = body[name]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        chat["include_reasoning"] = False  # the session reads and checks it, and leaves it out
    return chat


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
        self.request = self.body
        for name in _UNSUPPORTED:
            if self.request.get(name):
                raise PolicyError(
                    f"'{name}' is not supported on /v1/messages in {self.policy.mode} mode "
                    "(X-Faithproxy-Mode: off passes it through to vLLM)",
                    param=name,
                )
        self.body = chat_body(self.request)
        # The limits and the image-URL policy of admission, on the images the chat body now names.
        check_body(self.body, self.state.settings)
        await settle_media_urls(self.body, self.state.settings.image_urls, self.state.image_fetcher)
        response = await super().respond()
        if isinstance(response, JSONResponse) and response.status_code >= 400:  # an OpenAI error body
            error = json.loads(bytes(response.body)).get("error") or {}
            body = anthropic_error(response.status_code, str(error.get("message") or "error"))
            return JSONResponse(body, status_code=response.status_code, headers=self.headers)
        return response

    async def _passthrough(self) -> Response:
        from faithproxy.server.doors.off import Passthrough

        return Passthrough(self.state, self.admitted, path=MESSAGES_PATH)

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
