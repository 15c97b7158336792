"""POST /v1/chat/completions: OpenAI's chat completions, the door every other one is translated to.

The body is read by its model (`ChatCompletionRequest`: messages, model, stream; unknown fields pass
through), and in a verified mode drives vLLM's chat completions as it is: the chain's own rounds
(server/chain/session.py `CHAT_WIRE`), so this door needs no translation and no round wire. The
machine's emits go out as `chat.completion.chunk`s (`ChatRenderer`): a step's annotation rides as
`faithfulness` on the chunk that completes it, verdicts on a chunk of their own, the summary and the
judge's bill on the last chunk and on a non-streamed `chat.completion`; the OpenAI SDK keeps unknown
fields. `off` passes vLLM's own /v1/chat/completions through (server/doors/off.py), and the shadow check
reads what it passed (`chat_events`).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, SkipValidation

from faithproxy.clients.vllm import CHAT_PATH
from faithproxy.server.doors.bodies import body_parser
from faithproxy.server.doors.captured import chat_reader, chunk_events, json_body, sse_objects
from faithproxy.server.doors.schema import (
    Absent,
    DoorRequest,
    OpenModel,
    StreamOptions,
    TokenLimit,
    openai_responses,
)
from faithproxy.server.protocol.doors import Api, Door
from faithproxy.server.protocol.errors import error_frame
from faithproxy.server.protocol.render import Answer, Ending, Renderer, Reply
from faithproxy.server.protocol.sse import TEXT_MARKER, TEXT_MARKER_JSON, data_frame

if TYPE_CHECKING:
    from faithproxy.faithcore.correction import EmitExtra, EmitText
    from faithproxy.faithcore.errors import FaithproxyError
    from faithproxy.server.protocol.wires import RoundEvents


# ---- the request: its parser and its OpenAPI ------------------------------------------------------


class ImageURL(OpenModel):
    url: str = Field(description="A base64 data: URL or an http(s) URL.")
    detail: str | None = None


class TextPart(OpenModel):
    type: Literal["text"]
    text: str


class ImagePart(OpenModel):
    type: Literal["image_url"]
    image_url: ImageURL


# A part vLLM takes that the proxy does not read (audio, video, a bare string) passes, and so does a text
# or image part the proxy cannot use: the session skips it and vLLM answers for it. So the parts are
# documented (OpenAPI, the fuzzer's grammar) and not validated: with every part accepted, building a
# model of each per request would check nothing and cost most of the parse.
ChatPart = Annotated[TextPart | ImagePart | str | dict[str, Any], SkipValidation]


class ChatMessage(OpenModel):
    role: str = Field(description="system, developer, user, assistant or tool.")
    content: str | list[ChatPart] | None = Field(default=None, union_mode="left_to_right")


class ChatCompletionRequest(DoorRequest):
    """An OpenAI chat completion request; fields not listed are forwarded to vLLM untouched."""

    messages: list[ChatMessage] = Field(min_length=1)
    stream_options: StreamOptions | None = None
    max_tokens: TokenLimit | None = None
    max_completion_tokens: TokenLimit | None = None
    n: int | None = Field(default=1, ge=1, description="Only 1 unless X-Faithproxy-Mode is off.")
    temperature: float | None = None
    seed: int | None = None


parse_chat_body = body_parser(ChatCompletionRequest)


# ---- the shadow check: a chat response off mode passed through -----------------------------------


def chat_events(data: bytes, stream: bool) -> RoundEvents | None:
    """The round a captured chat response holds: its chunks, or its one message read as one chunk."""
    if stream:
        return chunk_events(sse_objects(data), chat_reader())
    body = json_body(data) or {}
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return None
    delta = {k: v for k, v in message.items() if k != "role"}
    chunk = {"id": body.get("id"), "choices": [{"delta": delta, "finish_reason": choice.get("finish_reason")}]}
    return chunk_events([chunk], chat_reader())


# ---- the response: its shapes and its renderer -----------------------------------------------------
# The proxy's own fields ride beside OpenAI's: `faithfulness` and the judge's bill (an extra field named
# by server/chain/judge_bill.py); the OpenAI SDK keeps unknown fields.


class AssistantMessage(OpenModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning: str | None = Absent()
    reasoning_content: str | None = Absent()


class ChatChoice(OpenModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str


class ChatCompletion(OpenModel):
    """A whole chat completion (`usage`: every round added up; `faithfulness`: the summary)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: dict[str, Any]
    faithfulness: dict[str, Any]


class ChatDelta(OpenModel):
    role: Literal["assistant"] | None = Absent()
    content: str | None = Absent()
    reasoning: str | None = Absent()
    reasoning_content: str | None = Absent()


class ChunkChoice(OpenModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(OpenModel):
    """One chunk of a stream: a delta, or (`choices` empty) the usage a client asked for."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: dict[str, Any] | None = Absent()
    faithfulness: dict[str, Any] | None = Absent()


class ChatChunks:
    """The chunks of one response: one id, one `created`, one model for all of them, the role on the
    first delta only. `text_frame` is the per-token path: the frame of a text chunk is serialized from
    the model once per field, split around its text, and only the text is encoded per token."""

    chunk_type: type[OpenModel] = ChatCompletionChunk

    def __init__(self, completion_id: str, model: str) -> None:
        self.id = completion_id
        self.model = model
        self.created = int(time.time())
        self._sent_role = False
        self._templates: dict[str, tuple[bytes, bytes]] = {}

    def choice(self, delta: dict[str, Any], finish_reason: str | None) -> OpenModel:
        return ChunkChoice(delta=ChatDelta(**delta), finish_reason=finish_reason)

    def chunk(self, delta: dict[str, Any], *, finish_reason: str | None = None, **extra: Any) -> OpenModel:
        if not self._sent_role:
            delta = {"role": "assistant", **delta}
            self._sent_role = True
        choices = [self.choice(delta, finish_reason)]
        return self.chunk_type(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def usage_chunk(self, usage: dict[str, Any], **extra: Any) -> OpenModel:
        return self.chunk_type(id=self.id, created=self.created, model=self.model, choices=[], usage=usage, **extra)

    def text_frame(self, field: str, text: str) -> bytes:
        """The frame of `chunk({field: text})`, byte for byte."""
        if not self._sent_role:
            return data_frame(self.chunk({field: text}))
        head, tail = self._templates.get(field) or self._template(field)
        return head + json.dumps(text, ensure_ascii=False).encode() + tail

    def _template(self, field: str) -> tuple[bytes, bytes]:
        # The delta is the last string of a text chunk: rpartition finds it whatever the id or model say.
        head, _, tail = data_frame(self.chunk({field: TEXT_MARKER})).rpartition(TEXT_MARKER_JSON)
        self._templates[field] = head, tail
        return head, tail


class ChatRenderer(Renderer):
    """OpenAI chunks out: each emit one chunk of `chunk_factory`, the usage chunk on request, the whole
    response as a `chat.completion`. The completions door renders its `text_completion`s the same way,
    with chunks and a body of its own (server/doors/completions.py)."""

    chunk_factory: type[ChatChunks] = ChatChunks
    id_prefix = "chatcmpl"

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply)
        self.id = f"{self.id_prefix}-{reply.request_id}"
        self.chunks = self.chunk_factory(self.id, reply.model)

    def text(self, item: EmitText, step: dict[str, Any] | None) -> list[bytes]:
        if step is None:  # detect mode's per-token deltas: only the text is encoded
            return [self.chunks.text_frame(item.field, item.text)]
        return [data_frame(self.chunks.chunk({item.field: item.text}, faithfulness={"step": step}))]

    def verdicts(self, verdicts: list[dict[str, Any]]) -> list[bytes]:
        return [data_frame(self.chunks.chunk({}, faithfulness={"verdicts": verdicts}))]

    def extra(self, item: EmitExtra) -> list[bytes]:
        return [data_frame(self.chunks.chunk(item.delta))]

    def end(self, finish_reason: str | None, ending: Ending) -> list[bytes]:
        chunk = self.chunks.chunk(
            {}, finish_reason=finish_reason or "stop", faithfulness=ending.summary, **ending.judge_usage
        )
        return [data_frame(chunk)]

    def usage(self, ending: Ending) -> list[bytes]:
        return [data_frame(self.chunks.usage_chunk(ending.usage, **ending.judge_usage))]

    def error(self, exc: FaithproxyError) -> bytes:
        return error_frame(exc)

    def body(self, answer: Answer, ending: Ending) -> OpenModel:
        text = {name: answer.text[name] for name in ("reasoning", "reasoning_content") if name in answer.text}
        message = AssistantMessage(**{"content": answer.text.get("content"), **text, **answer.extras})
        choice = ChatChoice(message=message, finish_reason=answer.finish_reason or "stop")
        return ChatCompletion(**self.envelope(ending), choices=[choice])

    def envelope(self, ending: Ending) -> dict[str, Any]:
        """The fields of a whole OpenAI response around its choices (chat and completions share them)."""
        return {
            "id": self.id,
            "created": int(self.reply.started_wall),
            "model": self.reply.model,
            "usage": ending.usage,
            "faithfulness": ending.summary,
            **ending.judge_usage,
        }


DOOR = Door(
    path=CHAT_PATH,
    api=Api.OPENAI,
    parse=parse_chat_body,
    renderer=ChatRenderer,
    off_path=CHAT_PATH,
    shadow_reader=chat_events,
    request_model=ChatCompletionRequest,
    openapi_responses=openai_responses(
        "A chat completion (JSON), or chat.completion.chunks (SSE) when stream=true.", ChatCompletion
    ),
    name="chat_completions",
)
