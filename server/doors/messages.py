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
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, SkipValidation

from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.types import Channel
from faithproxy.server.doors.bodies import body_parser
from faithproxy.server.doors.captured import json_body, sse_objects, text_events
from faithproxy.server.doors.schema import Absent, DoorRequest, OpenModel, TokenLimit
from faithproxy.server.protocol.doors import Api, Door
from faithproxy.server.protocol.errors import AnthropicErrorResponse, anthropic_error_model
from faithproxy.server.protocol.render import Answer, Ending, Renderer, Reply
from faithproxy.server.protocol.sse import TEXT_MARKER, TEXT_MARKER_JSON, event_frame

if TYPE_CHECKING:
    from faithproxy.faithcore.correction import EmitText
    from faithproxy.faithcore.errors import FaithproxyError
    from faithproxy.server.protocol.wires import RoundEvents

MESSAGES_PATH = "/v1/messages"
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


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


# Other blocks (thinking sent back, tool use, documents) pass: off mode forwards them, and the translation
# reads thinking and refuses the rest. So blocks are documented and not validated (as chat's parts).
AnthropicBlock = Annotated[AnthropicText | AnthropicImage | dict[str, Any], SkipValidation]


class AnthropicMessage(OpenModel):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicBlock] = Field(union_mode="left_to_right")


class MessagesRequest(DoorRequest):
    """An Anthropic Messages API request; fields not listed are forwarded to vLLM untouched in off mode."""

    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: TokenLimit = Field(description="Required, as for Anthropic.")
    system: str | list[dict[str, Any]] | None = Field(default=None, description="A string or text blocks.")
    temperature: float | None = None


parse_messages_body = body_parser(MessagesRequest)


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
    """One message as a chat message (its role and that its content is a string or a list are
    `AnthropicMessage`'s; the blocks are read here)."""
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return {"role": role, "content": content}
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


def _system_text(system: str | list[dict[str, Any]]) -> str:
    if isinstance(system, str):
        return system
    texts = [b.get("text") for b in system]
    if not all(isinstance(t, str) for t in texts):
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


# ---- the response: its shapes and its renderer -----------------------------------------------------


class TextBlock(OpenModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(OpenModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # the proxy signs nothing


ContentBlock = TextBlock | ThinkingBlock


class MessageUsage(OpenModel):
    input_tokens: int
    output_tokens: int


class MessagesResponse(OpenModel):
    """An Anthropic message: when whole, `faithfulness` (the summary) and the judge's bill (an extra
    field) ride beside `usage`; the anthropic SDK keeps unknown fields."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: MessageUsage
    faithfulness: dict[str, Any] | None = Absent()


class TextDelta(OpenModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(OpenModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class StopDelta(OpenModel):
    stop_reason: str
    stop_sequence: str | None = None


class OutputUsage(OpenModel):
    output_tokens: int


class MessagesEvent(OpenModel):
    """What every event holds: its type, also the SSE event's name."""

    type: str


class MessageStart(MessagesEvent):
    type: Literal["message_start"] = "message_start"
    message: MessagesResponse


class ContentBlockStart(MessagesEvent):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock


class ContentBlockDelta(MessagesEvent):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextDelta | ThinkingDelta
    faithfulness: dict[str, Any] | None = Absent()  # a step's annotation


class ContentBlockStop(MessagesEvent):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDelta(MessagesEvent):
    """The stop reason and output tokens, with `faithfulness` (the summary) and the judge's bill."""

    type: Literal["message_delta"] = "message_delta"
    delta: StopDelta
    usage: OutputUsage
    faithfulness: dict[str, Any]


class MessageStop(MessagesEvent):
    type: Literal["message_stop"] = "message_stop"


class Ping(MessagesEvent):
    """Detect mode's verdicts ride on a ping: the SDK skips pings, a raw-SSE client reads them."""

    type: Literal["ping"] = "ping"
    faithfulness: dict[str, Any] | None = Absent()


def _frame(event: MessagesEvent) -> bytes:
    return event_frame(event.type, event)


def _usage(usage: dict[str, Any]) -> MessageUsage:
    return MessageUsage(input_tokens=usage.get("prompt_tokens") or 0, output_tokens=usage.get("completion_tokens") or 0)


def _stop_reason(finish_reason: str | None) -> str:
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn")


class MessagesEvents:
    """The Messages events of one message: content blocks in order (`thinking` for reasoning text,
    `text` for answer text), each started, filled by deltas and stopped. A delta without annotation
    (detect mode's, one per token) is its block's template, serialized from `ContentBlockDelta` once,
    with the text spliced in."""

    def __init__(self, message_id: str, model: str) -> None:
        self.id = message_id
        self.model = model
        self.blocks = 0  # blocks started so far
        self._open: str | None = None  # the type of the block being written
        self._template: tuple[bytes, bytes] = (b"", b"")  # the open block's plain delta, split at its text
        self._started = False

    def message(
        self, content: list[ContentBlock], stop_reason: str | None, usage: dict[str, Any], **extra: Any
    ) -> MessagesResponse:
        return MessagesResponse(
            id=self.id, model=self.model, content=content, stop_reason=stop_reason, usage=_usage(usage), **extra
        )

    def start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [_frame(MessageStart(message=self.message([], None, {})))]

    @staticmethod
    def _delta(kind: str, index: int, text: str, **extra: Any) -> ContentBlockDelta:
        delta = ThinkingDelta(thinking=text) if kind == "thinking" else TextDelta(text=text)
        return ContentBlockDelta(index=index, delta=delta, **extra)

    def text(self, channel: Channel, text: str, faithfulness: dict[str, Any] | None) -> list[bytes]:
        kind = "thinking" if channel is Channel.REASONING else "text"
        frames = self.start()
        if self._open is not None and self._open != kind:
            frames += self.close()
        if self._open is None:
            self._open = kind
            block: ContentBlock = ThinkingBlock(thinking="") if kind == "thinking" else TextBlock(text="")
            frames.append(_frame(ContentBlockStart(index=self.blocks, content_block=block)))
            head, _, tail = _frame(self._delta(kind, self.blocks, TEXT_MARKER)).rpartition(TEXT_MARKER_JSON)
            self._template = head, tail
            self.blocks += 1
        if faithfulness is not None:
            return [*frames, _frame(self._delta(kind, self.blocks - 1, text, faithfulness=faithfulness))]
        head, tail = self._template
        return [*frames, head + json.dumps(text, ensure_ascii=False).encode() + tail]

    def close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [_frame(ContentBlockStop(index=self.blocks - 1))]

    def end(self, finish_reason: str | None, ending: Ending) -> list[bytes]:
        """The closing events; the summary and the judge's bill ride on message_delta beside `usage`."""
        delta = StopDelta(stop_reason=_stop_reason(finish_reason))
        usage = OutputUsage(output_tokens=ending.usage.get("completion_tokens") or 0)
        last = MessageDelta(delta=delta, usage=usage, faithfulness=ending.summary, **ending.judge_usage)
        return [*self.start(), *self.close(), _frame(last), _frame(MessageStop())]


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
        # the summary on message_delta carries every verdict too
        return [*self.events.start(), _frame(Ping(faithfulness={"verdicts": verdicts}))]

    def end(self, finish_reason: str | None, ending: Ending) -> list[bytes]:
        return self.events.end(finish_reason, ending)

    def error(self, exc: FaithproxyError) -> bytes:
        return event_frame("error", anthropic_error_model(exc.status_code, exc.message))  # the error body itself

    def body(self, answer: Answer, ending: Ending) -> MessagesResponse:
        content: list[ContentBlock] = []
        thinking = answer.text.get("reasoning") or answer.text.get("reasoning_content")
        if thinking:
            content.append(ThinkingBlock(thinking=thinking))
        content.append(TextBlock(text=answer.text.get("content", "")))
        stop = _stop_reason(answer.finish_reason)
        return self.events.message(content, stop, ending.usage, faithfulness=ending.summary, **ending.judge_usage)


MESSAGES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": MessagesResponse, "description": "An Anthropic message (JSON), or its SSE events when stream=true."},
    400: {"model": AnthropicErrorResponse, "description": "Invalid body, header or image."},
    401: {"model": AnthropicErrorResponse, "description": "Missing or wrong API key."},
    413: {"model": AnthropicErrorResponse, "description": "Body or image too large."},
    429: {"model": AnthropicErrorResponse, "description": "Too many concurrent requests (see Retry-After)."},
    502: {"model": AnthropicErrorResponse, "description": "vLLM or the detector failed."},
}


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
