"""POST /v1/chat/completions: OpenAI's chat completions, the door every other one is translated to.

The body is read as vLLM reads it (`parse_chat_body`: messages, model, stream; unknown fields pass
through), and in a verified mode drives vLLM's chat completions as it is: the chain's own rounds
(server/chain/session.py `CHAT_WIRE`), so this door needs no translation and no round wire. The
machine's emits go out as `chat.completion.chunk`s (`ChatRenderer`): a step's annotation rides as
`faithfulness` on the chunk that completes it, verdicts on a chunk of their own, the summary and the
judge's bill on the last chunk and on a non-streamed `chat.completion`; the OpenAI SDK keeps unknown
fields. `off` passes vLLM's own /v1/chat/completions through (server/doors/off.py), and the shadow check
reads what it passed (`chat_events`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from faithproxy.clients.vllm import CHAT_PATH
from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.doors.bodies import json_object, model_and_stream
from faithproxy.server.doors.captured import chat_reader, chunk_events, json_body, sse_objects
from faithproxy.server.doors.schema import OpenModel, StreamOptions, openai_responses
from faithproxy.server.protocol.doors import Api, Door
from faithproxy.server.protocol.errors import error_frame
from faithproxy.server.protocol.render import Answer, Ending, Renderer, Reply
from faithproxy.server.protocol.sse import ChunkFactory, frame

if TYPE_CHECKING:
    from faithproxy.faithcore.correction import EmitExtra, EmitText
    from faithproxy.faithcore.errors import FaithproxyError
    from faithproxy.server.protocol.wires import RoundEvents


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """A /v1/chat/completions body, else a PolicyError (400). Unknown fields pass through untouched."""
    body = json_object(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise PolicyError("'messages' must be a non-empty list of message objects", param="messages")
    return model_and_stream(body)


# ---- OpenAPI: what the proxy reads of a chat body (documentation and the fuzzer's grammar) -------


class ImageURL(OpenModel):
    url: str = Field(description="A base64 data: URL or an http(s) URL.")
    detail: str | None = None


class TextPart(OpenModel):
    type: Literal["text"]
    text: str


class ImagePart(OpenModel):
    type: Literal["image_url"]
    image_url: ImageURL


class ChatMessage(OpenModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImagePart] | None = None


class ChatCompletionRequest(OpenModel):
    """An OpenAI chat completion request; fields not listed are forwarded to vLLM untouched."""

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=1, ge=1, description="Only 1 unless X-Faithproxy-Mode is off.")
    temperature: float | None = None
    seed: int | None = None


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


# ---- the renderer ----------------------------------------------------------------------------------


class ChatRenderer(Renderer):
    """OpenAI chunks out: each emit one chunk of `chunk_factory`, the usage chunk on request, the whole
    response as a `chat.completion`. The completions door renders its `text_completion`s the same way,
    with a chunk factory and a body of its own (server/doors/completions.py)."""

    chunk_factory: type[ChunkFactory] = ChunkFactory
    id_prefix = "chatcmpl"

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply)
        self.id = f"{self.id_prefix}-{reply.request_id}"
        self.chunks = self.chunk_factory(self.id, reply.model)

    def text(self, item: EmitText, step: dict[str, Any] | None) -> list[bytes]:
        if step is None:  # detect mode's per-token deltas: only the text is encoded
            return [self.chunks.text_frame(item.field, item.text)]
        return [frame(self.chunks.chunk({item.field: item.text}, extra={"faithfulness": {"step": step}}))]

    def verdicts(self, verdicts: list[dict[str, Any]]) -> list[bytes]:
        return [frame(self.chunks.chunk({}, extra={"faithfulness": {"verdicts": verdicts}}))]

    def extra(self, item: EmitExtra) -> list[bytes]:
        return [frame(self.chunks.chunk(item.delta))]

    def end(self, finish_reason: str | None, ending: Ending) -> list[bytes]:
        extra = {"faithfulness": ending.summary, **ending.judge_usage}
        return [frame(self.chunks.chunk({}, finish_reason=finish_reason or "stop", extra=extra))]

    def usage(self, ending: Ending) -> list[bytes]:
        return [frame({**self.chunks.usage_chunk(ending.usage), **ending.judge_usage})]

    def error(self, exc: FaithproxyError) -> bytes:
        return error_frame(exc)

    def body(self, answer: Answer, ending: Ending) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": answer.text.get("content"), **answer.extras}
        for name in ("reasoning", "reasoning_content"):
            if name in answer.text:
                message[name] = answer.text[name]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": answer.finish_reason or "stop"}
        return self.openai_body("chat.completion", choice, ending)

    def openai_body(self, object_name: str, choice: dict[str, Any], ending: Ending) -> dict[str, Any]:
        """A whole OpenAI response around its one choice (chat and completions share the envelope)."""
        return {
            "id": self.id,
            "object": object_name,
            "created": int(self.reply.started_wall),
            "model": self.reply.model,
            "choices": [choice],
            "usage": ending.usage,
            **ending.judge_usage,
            "faithfulness": ending.summary,
        }


DOOR = Door(
    path=CHAT_PATH,
    api=Api.OPENAI,
    parse=parse_chat_body,
    renderer=ChatRenderer,
    off_path=CHAT_PATH,
    shadow_reader=chat_events,
    request_model=ChatCompletionRequest,
    openapi_responses=openai_responses("A chat completion (JSON), or an SSE stream when stream=true."),
    name="chat_completions",
)
