"""POST /v1/messages: Anthropic's Messages API.

As for the Responses door (server/doors/responses.py), the request is read as a chat request
(`translate`: `system` becomes the system message, text and image blocks, base64 or url, chat content
parts, `max_tokens` stays, `stop_sequences` is `stop`) and driven through vLLM's chat completions as the
chat door drives it. The machine's emits become Messages events (`MessagesRenderer`, with
`MessagesEvents`): reasoning text as a `thinking` block (`thinking_delta`), answer text as a `text`
block (`text_delta`), one delta per verified step in `correct`. A step's annotation rides as
`faithfulness` on its delta event, and the summary on `message_delta` and on a non-streamed message;
the anthropic SDK keeps unknown fields. Errors are Anthropic's (`{"type": "error", "error": {...}}`,
the door's `Api`), before the first byte and as an `error` event after it.

`off` passes vLLM's own /v1/messages through (server/doors/off.py, its refusals and a broken stream's
last event in Anthropic's format too), and the shadow check reads what it passed (`messages_events`).
Tools and non-text, non-image blocks are a 400 in `detect` and `correct`.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.types import Channel
from faithproxy.server.doors.bodies import json_object, model_and_stream
from faithproxy.server.doors.captured import json_body, sse_objects, text_events
from faithproxy.server.doors.schema import OpenModel
from faithproxy.server.protocol.doors import Api, Door
from faithproxy.server.protocol.errors import anthropic_error
from faithproxy.server.protocol.render import Answer, Ending, Renderer, Reply

if TYPE_CHECKING:
    from faithproxy.faithcore.correction import EmitText
    from faithproxy.faithcore.errors import FaithproxyError
    from faithproxy.server.protocol.wires import RoundEvents

MESSAGES_PATH = "/v1/messages"
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def parse_messages_body(raw: bytes) -> dict[str, Any]:
    """An Anthropic /v1/messages body, else a PolicyError (400; the door answers in Anthropic's format)."""
    body = json_object(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise PolicyError("'messages' must be a non-empty list of message objects", param="messages")
    limit = body.get("max_tokens")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise PolicyError("'max_tokens' is required and must be a positive integer", param="max_tokens")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise PolicyError("'system' must be a string or a list of text blocks", param="system")
    return model_and_stream(body)


# ---- the translation to chat ------------------------------------------------------------------------

_UNSUPPORTED = ("tools", "tool_choice", "mcp_servers", "container")
_PASSED_ON = ("temperature", "top_p", "top_k", "seed")


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


def translate(body: dict[str, Any], mode: str) -> dict[str, Any]:
    """A PolicyError (400) for what a verified chain can't carry (tools), else the chat body."""
    for name in _UNSUPPORTED:
        if body.get(name):
            raise PolicyError(
                f"'{name}' is not supported by the Messages API in {mode} mode "
                "(X-Faithproxy-Mode: off passes it through to vLLM)",
                param=name,
            )
    return chat_body(body)


# ---- the shadow check: a Messages response off mode passed through --------------------------------

_FINISH_REASONS = {"max_tokens": "length", "end_turn": "stop", "stop_sequence": "stop"}


def messages_events(data: bytes, stream: bool) -> RoundEvents | None:
    """The round a captured message holds: its thinking and text, in order."""
    texts: list[tuple[str, str]] = []
    stop = message_id = None
    if stream:
        objs = sse_objects(data)
        if objs is None:
            return None
        for obj in objs:
            kind, delta = obj.get("type"), obj.get("delta") or {}
            if kind == "error":
                return None  # the stream broke off: what came before it is no whole chain
            if kind == "message_start":
                message_id = (obj.get("message") or {}).get("id")
            elif kind == "content_block_delta" and delta.get("type") == "thinking_delta":
                texts.append(("reasoning", delta.get("thinking") or ""))
            elif kind == "content_block_delta" and delta.get("type") == "text_delta":
                texts.append(("content", delta.get("text") or ""))
            elif kind == "message_delta":
                stop = delta.get("stop_reason") or stop
    else:
        message = json_body(data) or {}
        message_id, stop = message.get("id"), message.get("stop_reason")
        for block in message.get("content") or ():
            if block.get("type") == "thinking":
                texts.append(("reasoning", block.get("thinking") or ""))
            elif block.get("type") == "text":
                texts.append(("content", block.get("text") or ""))
    texts = [(field, text) for field, text in texts if text]
    if not texts:
        return None
    return text_events(texts, _FINISH_REASONS.get(stop or "", stop), message_id)


# ---- OpenAPI ---------------------------------------------------------------------------------------


class AnthropicText(OpenModel):
    type: Literal["text"]
    text: str


class AnthropicImageSource(OpenModel):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class AnthropicImage(OpenModel):
    type: Literal["image"]
    source: AnthropicImageSource


class AnthropicMessage(OpenModel):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicText | AnthropicImage]


class MessagesRequest(OpenModel):
    """An Anthropic Messages API request; fields not listed are forwarded to vLLM untouched in off mode."""

    model: str = Field(min_length=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stream: bool | None = False
    temperature: float | None = None


MESSAGES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "An Anthropic message (JSON), or its SSE events when stream=true."},
    400: {"description": "Invalid body, header or image (Anthropic's error format)."},
    401: {"description": "Missing or wrong API key."},
    413: {"description": "Body or image too large."},
    429: {"description": "Too many concurrent requests (see Retry-After)."},
    502: {"description": "vLLM or the detector failed."},
}


# ---- the renderer ----------------------------------------------------------------------------------


class MessagesEvents:
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


class MessagesRenderer(Renderer):
    """Messages events out (a stream ends on message_stop or an error event, with no [DONE]), errors in
    Anthropic's format, the message as a whole body."""

    done = b""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply)
        self.id = f"msg_{reply.request_id}"
        self.events = MessagesEvents(self.id, reply.model)

    def text(self, item: EmitText, step: dict[str, Any] | None) -> list[bytes]:
        return self.events.text(item.channel, item.text, None if step is None else {"step": step})

    def verdicts(self, verdicts: list[dict[str, Any]]) -> list[bytes]:
        # on a `ping` event: the SDK skips pings, a raw-SSE client reads them; the summary on
        # message_delta carries every verdict too
        return [*self.events.start(), self.events.event("ping", faithfulness={"verdicts": verdicts})]

    def end(self, finish_reason: str | None, ending: Ending) -> list[bytes]:
        return self.events.end(finish_reason, ending.usage, ending.summary, ending.judge_usage)

    def error(self, exc: FaithproxyError) -> bytes:
        return MessagesEvents.event("error", error=anthropic_error(exc.status_code, exc.message)["error"])

    def body(self, answer: Answer, ending: Ending) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        thinking = answer.text.get("reasoning") or answer.text.get("reasoning_content")
        if thinking:
            content.append({"type": "thinking", "thinking": thinking, "signature": ""})
        content.append({"type": "text", "text": answer.text.get("content", "")})
        stop = _STOP_REASONS.get(answer.finish_reason or "stop", "end_turn")
        message = MessagesEvents(self.id, self.reply.model).message(content, stop, ending.usage)
        return {**message, **ending.judge_usage, "faithfulness": ending.summary}


DOOR = Door(
    path=MESSAGES_PATH,
    api=Api.ANTHROPIC,
    parse=parse_messages_body,
    renderer=MessagesRenderer,
    off_path=MESSAGES_PATH,
    translate=translate,
    shadow_reader=messages_events,
    stream_end=(b"event: message_stop",),
    request_model=MessagesRequest,
    openapi_responses=MESSAGES_RESPONSES,
    name="messages",
)
