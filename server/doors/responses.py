"""POST /v1/responses: OpenAI's Responses API.

The Responses API offers no way to continue a partial message, so in `detect` and `correct` the request
is read as a chat request (`translate`: `instructions` become the system message, `input` items the
messages, `input_image` parts image_url parts, `max_output_tokens` the max_tokens) and driven through
vLLM's chat completions as the chat door drives it; only the rendering differs: the machine's emits
become Responses events (`ResponsesRenderer`, with `ResponsesEvents`): reasoning text as a `reasoning`
item (`response.reasoning_text.delta`), answer text as a `message` item (`response.output_text.delta`),
one delta per verified step in `correct`. A step's annotation rides as `faithfulness` on its delta
event and the summary on the final response; the openai SDK keeps unknown fields, so its typed events
still parse. `off` passes vLLM's own /v1/responses through (server/doors/off.py), and the shadow check
reads what it passed (`responses_events`).

What a stateless verified chain cannot do (`previous_response_id`, `conversation`, `store`,
`background`, tools, non-message input items) is a 400 in `detect` and `correct` naming it, and that
`off` passes it through.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.types import Channel
from faithproxy.server.doors.bodies import body_parser
from faithproxy.server.doors.captured import json_body, sse_objects, text_events
from faithproxy.server.doors.schema import Absent, DoorRequest, OpenModel, TokenLimit, openai_responses
from faithproxy.server.protocol.doors import Api, Door
from faithproxy.server.protocol.errors import error_frame
from faithproxy.server.protocol.render import Answer, Ending, Renderer, Reply
from faithproxy.server.protocol.sse import TEXT_MARKER, TEXT_MARKER_JSON, event_frame

if TYPE_CHECKING:
    from faithproxy.faithcore.correction import EmitText
    from faithproxy.faithcore.errors import FaithproxyError
    from faithproxy.server.protocol.wires import RoundEvents

RESPONSES_PATH = "/v1/responses"


class ResponsesRequest(DoorRequest):
    """An OpenAI Responses API request; fields not listed are forwarded to vLLM untouched in off mode."""

    input: Annotated[str, Field(min_length=1)] | Annotated[list[dict[str, Any] | str], Field(min_length=1)] = Field(
        description="A non-empty string or a non-empty list of input items: message items (input_text, "
        "input_image parts) and reasoning items unless X-Faithproxy-Mode is off.",
        union_mode="left_to_right",
    )
    instructions: str | None = None
    max_output_tokens: TokenLimit | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, Any] | None = None


parse_responses_body = body_parser(ResponsesRequest)


# ---- the translation to chat ------------------------------------------------------------------------

_UNSUPPORTED = ("previous_response_id", "conversation", "store", "background", "tools", "prompt")
_PASSED_ON = ("temperature", "top_p", "seed", "user", "metadata", "top_k", "repetition_penalty")


def _unsupported(body: dict[str, Any]) -> str | None:
    for name in _UNSUPPORTED:
        if body.get(name) not in (None, False, []):
            return name
    return None


def _part(part: Any, where: str) -> dict[str, Any]:
    """One content part as a chat content part."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image: dict[str, Any] = {"url": part["image_url"]}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise PolicyError(
        f"{where}: only input_text and input_image (image_url) parts are supported outside X-Faithproxy-Mode: off",
        param="input",
    )


def _reasoning(item: dict[str, Any], index: int) -> str:
    """The text of a reasoning item a client sent back (an earlier response's output)."""
    if item.get("encrypted_content"):
        raise PolicyError(f"input[{index}]: encrypted reasoning content is not supported", param="input")
    for key in ("content", "summary"):  # vLLM's own mapping: the content, else the summary
        parts = item.get(key)
        if isinstance(parts, list) and parts and isinstance(parts[0], dict) and isinstance(parts[0].get("text"), str):
            return str(parts[0]["text"])
    return ""


def _messages(given: list[Any]) -> list[dict[str, Any]]:
    """Input items as chat messages. A reasoning item becomes the `reasoning` of an assistant message, and the
    assistant message item after it joins that message (as vLLM's own /v1/responses builds them); whether
    past reasoning is rendered is the chat template's choice."""
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(given):
        last = messages[-1] if messages else None
        if isinstance(item, dict) and item.get("type") == "reasoning":
            messages.append({"role": "assistant", "reasoning": _reasoning(item, index)})
            continue
        message = _message(item, index)
        if last is not None and "reasoning" in last and "content" not in last and message["role"] == "assistant":
            last["content"] = message["content"]
            continue
        messages.append(message)
    for message in messages:
        message.setdefault("content", "")  # a reasoning item with no message after it
    return messages


def _message(item: Any, index: int) -> dict[str, Any]:
    if isinstance(item, str):
        return {"role": "user", "content": item}
    if item.get("type", "message") != "message" or item.get("role") not in ("user", "assistant", "system", "developer"):
        raise PolicyError(
            f"input[{index}]: only message items are supported outside X-Faithproxy-Mode: off", param="input"
        )
    role = "system" if item["role"] == "developer" else item["role"]
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise PolicyError(f"input[{index}].content must be a string or a list of parts", param="input")
    return {"role": role, "content": [_part(p, f"input[{index}].content[{i}]") for i, p in enumerate(content)]}


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses request as the chat request vLLM is driven with (a PolicyError for what has none)."""
    given = body["input"]
    messages = [{"role": "user", "content": given}] if isinstance(given, str) else []
    if isinstance(given, list):
        messages = _messages(given)
    if body.get("instructions"):
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "stream": bool(body.get("stream"))}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in _PASSED_ON:
        if body.get(name) is not None:
            chat[name] = body[name]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        chat["reasoning_effort"] = reasoning["effort"]
    return chat


def translate(body: dict[str, Any], mode: str) -> dict[str, Any]:
    """A PolicyError (400) for what a stateless verified chain can't do, else the chat body."""
    unsupported = _unsupported(body)
    if unsupported is not None:
        raise PolicyError(
            f"'{unsupported}' is not supported by the Responses API in {mode} mode: a verified chain is "
            "stateless and text-only (X-Faithproxy-Mode: off passes it through to vLLM)",
            param=unsupported,
        )
    return chat_body(body)


# ---- the shadow check: a Responses response off mode passed through -------------------------------


def responses_events(data: bytes, stream: bool) -> RoundEvents | None:
    """The round a captured Responses response holds: its reasoning and output text, in order."""
    texts: list[tuple[str, str]] = []
    if stream:
        objs = sse_objects(data)
        if objs is None:
            return None
        final = None
        for obj in objs:
            kind = obj.get("type")
            if kind == "response.reasoning_text.delta" and isinstance(obj.get("delta"), str):
                texts.append(("reasoning", obj["delta"]))
            elif kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):
                texts.append(("content", obj["delta"]))
            elif kind in ("response.completed", "response.incomplete"):
                final = obj.get("response")
            elif kind in ("response.failed", "error"):
                return None  # the response broke off: what came before it is no whole chain
        response = final if isinstance(final, dict) else {}
    else:
        response = json_body(data) or {}
        for item in response.get("output") or ():
            name = {"reasoning": "reasoning", "message": "content"}.get(item.get("type"))
            if name is None:
                continue
            for part in item.get("content") or ():
                if part.get("type") in ("reasoning_text", "output_text") and isinstance(part.get("text"), str):
                    texts.append((name, part["text"]))
    if not texts:
        return None
    incomplete = response.get("status") == "incomplete"
    return text_events(texts, "length" if incomplete else "stop", response.get("id"))


# ---- the response: its shapes and its renderer -----------------------------------------------------


class OutputText(OpenModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningText(OpenModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(OpenModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: str


class MessageItem(OpenModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: str
    content: list[OutputText]


OutputItem = ReasoningItem | MessageItem


class InputTokensDetails(OpenModel):
    cached_tokens: int = 0


class OutputTokensDetails(OpenModel):
    reasoning_tokens: int = 0


class ResponseUsage(OpenModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, usage: dict[str, Any]) -> ResponseUsage:
        """OpenAI's chat usage (prompt_tokens, completion_tokens) in the Responses API's names."""
        prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
        return cls(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion)


class IncompleteDetails(OpenModel):
    reason: str


class ResponseObject(OpenModel):
    """A Responses API response: the request's settings echoed, the output items, and once it is done
    `usage`, `faithfulness` (the summary) and the judge's bill (an extra field)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    model: str
    status: str
    output: list[OutputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    parallel_tool_calls: bool = False
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: str = "none"
    tools: list[Any] = Field(default_factory=list)
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    usage: ResponseUsage | None = Absent()
    faithfulness: dict[str, Any] | None = Absent()


class ResponsesEvent(OpenModel):
    """What every event holds: its type (also the SSE event's name) and its place in the stream."""

    type: str
    sequence_number: int


class ResponseEvent(ResponsesEvent):  # response.created, .in_progress, .completed, .incomplete
    response: ResponseObject


class OutputItemEvent(ResponsesEvent):  # response.output_item.added, .done
    output_index: int
    item: OutputItem


class ContentPartEvent(ResponsesEvent):  # response.content_part.added, .done
    item_id: str
    output_index: int
    content_index: int = 0
    part: OutputText


class TextDeltaEvent(ResponsesEvent):  # response.output_text.delta, response.reasoning_text.delta
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[Any] | None = Absent()  # output text only
    faithfulness: dict[str, Any] | None = Absent()  # a step's annotation


class TextDoneEvent(ResponsesEvent):  # response.output_text.done, response.reasoning_text.done
    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[Any] | None = Absent()


class VerdictsEvent(ResponsesEvent):  # response.faithfulness.verdicts, detect mode's
    faithfulness: dict[str, Any]


_SEQUENCE_MARKER = 987_654_321_987_654_321  # where a delta template's sequence number goes


@dataclass(slots=True)
class _Writing:
    """The output item being written: its text so far and, once a plain delta was sent, its template."""

    kind: str  # "reasoning" or "message"
    id: str
    index: int
    text: list[str] = field(default_factory=list)
    template: tuple[bytes, bytes, bytes] | None = None

    @property
    def delta_kind(self) -> str:
        return "response.reasoning_text.delta" if self.kind == "reasoning" else "response.output_text.delta"

    def delta(self, sequence_number: int, text: str, **extra: Any) -> TextDeltaEvent:
        logprobs = [] if self.kind == "message" else None
        return TextDeltaEvent(
            type=self.delta_kind,
            sequence_number=sequence_number,
            item_id=self.id,
            output_index=self.index,
            delta=text,
            logprobs=logprobs,
            **extra,
        )


class ResponsesEvents:
    """The Responses objects and events of one response: output items in order (a `reasoning` item for
    reasoning text, a `message` item for answer text), each opened, filled by deltas and closed. A delta
    without annotation (detect mode's, one per token) is its item's template, serialized from
    `TextDeltaEvent` once, with the sequence number and the text spliced in."""

    def __init__(self, response_id: str, model: str, request: dict[str, Any]) -> None:
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.request = request
        self.sequence = 0
        self.output: list[OutputItem] = []  # the items closed so far
        self._open: _Writing | None = None
        self._started = False

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence - 1

    def event(self, shape: type[ResponsesEvent], kind: str, **fields: Any) -> bytes:
        return event_frame(kind, shape(type=kind, sequence_number=self._next(), **fields))

    def response(self, status: str, **extra: Any) -> ResponseObject:
        body = self.request  # the client's body, as ResponsesRequest read it
        return ResponseObject(
            id=self.id,
            created_at=self.created,
            model=self.model,
            status=status,
            output=list(self.output),
            instructions=body.get("instructions"),
            max_output_tokens=body.get("max_output_tokens"),
            metadata=body.get("metadata") or {},
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            **extra,
        )

    def start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        response = self.response("in_progress")  # one object, written twice
        return [
            self.event(ResponseEvent, "response.created", response=response),
            self.event(ResponseEvent, "response.in_progress", response=response),
        ]

    def text(self, channel: Channel, text: str, faithfulness: dict[str, Any] | None) -> list[bytes]:
        kind = "reasoning" if channel is Channel.REASONING else "message"
        frames = self.start()
        if self._open is not None and self._open.kind != kind:
            frames += self.close()
        if self._open is None:
            frames += self._open_item(kind)
        item = self._open
        assert item is not None
        item.text.append(text)
        if faithfulness is not None:
            return [*frames, event_frame(item.delta_kind, item.delta(self._next(), text, faithfulness=faithfulness))]
        head, middle, tail = item.template or self._template(item)
        number = str(self._next()).encode()
        return [*frames, head + number + middle + json.dumps(text, ensure_ascii=False).encode() + tail]

    @staticmethod
    def _template(item: _Writing) -> tuple[bytes, bytes, bytes]:
        proto = event_frame(item.delta_kind, item.delta(_SEQUENCE_MARKER, TEXT_MARKER))
        head, _, rest = proto.partition(str(_SEQUENCE_MARKER).encode())
        middle, _, tail = rest.rpartition(TEXT_MARKER_JSON)  # the delta is the event's last string
        item.template = head, middle, tail
        return item.template

    def _open_item(self, kind: str) -> list[bytes]:
        index = len(self.output)
        if kind == "reasoning":
            self._open = _Writing(kind, f"rs_{self.id}_{index}", index)
            item: OutputItem = ReasoningItem(id=self._open.id, content=[], status="in_progress")
            return [self.event(OutputItemEvent, "response.output_item.added", output_index=index, item=item)]
        self._open = _Writing(kind, f"msg_{self.id}_{index}", index)
        item = MessageItem(id=self._open.id, status="in_progress", content=[])
        part = OutputText(text="")
        return [
            self.event(OutputItemEvent, "response.output_item.added", output_index=index, item=item),
            self.event(ContentPartEvent, "response.content_part.added", item_id=item.id, output_index=index, part=part),
        ]

    def close(self) -> list[bytes]:
        """Ends the item being written: its done events, and the item joins `output`."""
        item, self._open = self._open, None
        if item is None:
            return []
        text = "".join(item.text)
        final = self.item(item.kind, item.id, text)
        self.output.append(final)
        where = {"item_id": item.id, "output_index": item.index}
        done = "response.output_item.done"
        if isinstance(final, ReasoningItem):
            return [
                self.event(TextDoneEvent, "response.reasoning_text.done", **where, text=text),
                self.event(OutputItemEvent, done, output_index=item.index, item=final),
            ]
        return [
            self.event(TextDoneEvent, "response.output_text.done", **where, text=text, logprobs=[]),
            self.event(ContentPartEvent, "response.content_part.done", **where, part=final.content[0]),
            self.event(OutputItemEvent, done, output_index=item.index, item=final),
        ]

    @staticmethod
    def item(kind: str, item_id: str, text: str) -> OutputItem:
        if kind == "reasoning":
            return ReasoningItem(id=item_id, content=[ReasoningText(text=text)], status="completed")
        return MessageItem(id=item_id, status="completed", content=[OutputText(text=text)])

    def final(self, finish_reason: str | None, ending: Ending) -> ResponseObject:
        """The finished response object: `incomplete` when the token budget ended it."""
        done = {"usage": ResponseUsage.of(ending.usage), "faithfulness": ending.summary, **ending.judge_usage}
        if finish_reason == "length":
            return self.response("incomplete", incomplete_details=IncompleteDetails(reason="max_output_tokens"), **done)
        return self.response("completed", **done)


class ResponsesRenderer(Renderer):
    """Responses events out (a stream ends on its terminal event, with no [DONE], as vLLM's own), and
    the response object as a whole body."""

    done = b""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply)
        self.id = f"resp_{reply.request_id}"
        self.events = ResponsesEvents(self.id, reply.model, reply.request)

    def text(self, item: EmitText, step: dict[str, Any] | None) -> list[bytes]:
        return self.events.text(item.channel, item.text, None if step is None else {"step": step})

    def verdicts(self, verdicts: list[dict[str, Any]]) -> list[bytes]:
        kind = "response.faithfulness.verdicts"
        return [*self.events.start(), self.events.event(VerdictsEvent, kind, faithfulness={"verdicts": verdicts})]

    def end(self, finish_reason: str | None, ending: Ending) -> list[bytes]:
        events = self.events
        frames = [*events.start(), *events.close()]
        final = events.final(finish_reason, ending)
        kind = "response.incomplete" if final.status == "incomplete" else "response.completed"
        return [*frames, events.event(ResponseEvent, kind, response=final)]

    def error(self, exc: FaithproxyError) -> bytes:
        return error_frame(exc)

    def body(self, answer: Answer, ending: Ending) -> ResponseObject:
        events = ResponsesEvents(self.id, self.reply.model, self.reply.request)
        events.created = int(self.reply.started_wall)
        reasoning = answer.text.get("reasoning") or answer.text.get("reasoning_content")
        if reasoning:
            events.output.append(events.item("reasoning", f"rs_{events.id}_0", reasoning))
        message_id = f"msg_{events.id}_{len(events.output)}"
        events.output.append(events.item("message", message_id, answer.text.get("content", "")))
        return events.final(answer.finish_reason, ending)


DOOR = Door(
    path=RESPONSES_PATH,
    api=Api.OPENAI,
    parse=parse_responses_body,
    renderer=ResponsesRenderer,
    off_path=RESPONSES_PATH,
    translate=translate,
    shadow_reader=responses_events,
    stream_end=(b"event: response.completed", b"event: response.incomplete", b"event: response.failed"),
    request_model=ResponsesRequest,
    openapi_responses=openai_responses(
        "A Responses API response (JSON), or its SSE events when stream=true.", ResponseObject
    ),
    name="responses",
)
