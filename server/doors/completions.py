"""POST /v1/completions: a raw prompt, verified like a chat.

The client rendered the chat template itself, so there is none to continue through: a continuation
round sends the client's prompt with the accepted text appended (`completions_round_body`), and vLLM's
`/v1/completions` decodes on from there (`COMPLETIONS_WIRE`, the door's round wire). Its chunks
(`choices[0].text`) are read by `CompletionChunkReader` (faithcore/correction/wire.py) into the same
`Delta("content", ...)` events a chat stream gives, so the machine, the driver (server/chain/session.py)
and the accounting (server/doors/serving.py `DoorServing`) are every door's; detectors read the prompt as
one user message (`prompt_messages`). Emits go out as `text_completion` chunks (`CompletionRenderer`),
the `faithfulness` object beside `choices`, as it rides on chat chunks.

What a raw prompt can ask that a verified chain cannot give (token-id prompts, several prompts,
`echo`, `logprobs`, `suffix`, `best_of`, hints) is refused with a 400 in `detect` and `correct`
(`translate`, which leaves the body as it is); `off` passes every body vLLM takes straight through
(server/doors/off.py), and the shadow check reads what it passed (`completions_events`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import Field

from faithproxy.clients.vllm import COMPLETIONS_PATH
from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.types import Channel
from faithproxy.server.doors.bodies import body_parser
from faithproxy.server.doors.captured import chunk_events, completion_reader, json_body, sse_objects
from faithproxy.server.doors.chat import ChatChunks, ChatRenderer
from faithproxy.server.doors.schema import Absent, DoorRequest, OpenModel, StreamOptions, TokenLimit, openai_responses
from faithproxy.server.protocol.doors import Api, Door
from faithproxy.server.protocol.render import Answer, Ending
from faithproxy.server.protocol.wires import RoundWire

if TYPE_CHECKING:
    from faithproxy.faithcore.correction import StartRound
    from faithproxy.faithcore.reasoning_formats import ReasoningFormat
    from faithproxy.server.protocol.wires import RoundEvents

# Fields that change what a completion is beyond one chain of text; `off` passes them through.
_CORRECTING_REFUSES = ("echo", "logprobs", "suffix", "best_of", "prompt_logprobs")

T = TypeVar("T")
NonEmpty = Annotated[list[T], Field(min_length=1)]


class CompletionRequest(DoorRequest):
    """An OpenAI (legacy) completion request; fields not listed are forwarded to vLLM untouched."""

    prompt: str | NonEmpty[str] | NonEmpty[int] | NonEmpty[NonEmpty[int]] = Field(
        description="A string, or a non-empty list of strings, of token ids or of token-id lists: one string "
        "unless X-Faithproxy-Mode is off.",
        union_mode="left_to_right",
    )
    stream_options: StreamOptions | None = None
    max_tokens: TokenLimit | None = None
    n: int | None = Field(default=1, ge=1, description="Only 1 unless X-Faithproxy-Mode is off.")
    temperature: float | None = None
    seed: int | None = None


parse_completions_body = body_parser(CompletionRequest)


def prompt_text(body: dict[str, Any]) -> str | None:
    """The one text prompt of a completions body (a string, or a list holding one string), else None."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def translate(body: dict[str, Any], mode: str) -> dict[str, Any]:
    """The body itself, which a verified mode sends as it is; a PolicyError (400) for what a verified
    chain cannot give (`off` passes it through)."""
    if prompt_text(body) is None:
        raise PolicyError(
            f"'prompt' must be one string in {mode} mode (token ids and several prompts pass through "
            "with X-Faithproxy-Mode: off)",
            param="prompt",
        )
    for name in _CORRECTING_REFUSES:
        value = body.get(name)
        if value is not None and value is not False and not (name == "best_of" and value == 1):
            raise PolicyError(
                f"'{name}' is not supported on /v1/completions in {mode} mode (X-Faithproxy-Mode: off "
                "passes it through)",
                param=name,
            )
    return body


def prompt_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The prompt as one user message: what detectors, judges and the regenerator read."""
    return [{"role": "user", "content": prompt_text(body) or ""}]


# ---- the round wire: vLLM's /v1/completions ---------------------------------------------------------


def completions_round_body(client_body: dict[str, Any], start: StartRound) -> dict[str, Any]:
    """A completions round: the client's body streamed; a continuation extends the prompt with the
    accepted text, exactly as the model wrote it (no template, no bridge)."""
    body = {k: v for k, v in client_body.items() if k not in ("stream", "stream_options")}
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}  # usage of every round is added up
    if start.continuation is None or start.prefix is None:
        return body
    prefix = start.prefix.get(Channel.REASONING, "") + start.prefix.get(Channel.CONTENT, "")
    body["prompt"] = (prompt_text(client_body) or "") + prefix
    if start.max_tokens is not None:
        body["max_tokens"] = start.max_tokens
    return body


def _raw_prompt_format(fmt: ReasoningFormat) -> ReasoningFormat:
    """No chat template re-renders the accepted text, so nothing closes a think block on its behalf."""
    return dataclasses.replace(fmt, rewraps_final_message=False)


COMPLETIONS_WIRE = RoundWire(
    path=COMPLETIONS_PATH,
    round_body=completions_round_body,
    reader=completion_reader,
    reasoning_format=_raw_prompt_format,
)


def completions_events(data: bytes, stream: bool) -> RoundEvents | None:
    """The round a captured completions response holds (the shadow check's reader)."""
    chunks = sse_objects(data) if stream else ([body] if (body := json_body(data)) is not None else None)
    return chunk_events(chunks, completion_reader())


# ---- the response: its shapes and its renderer -----------------------------------------------------


class CompletionChoice(OpenModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class Completion(OpenModel):
    """A whole `text_completion` (`usage`: every round added up; `faithfulness`: the summary)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: dict[str, Any]
    faithfulness: dict[str, Any]


class CompletionChunk(OpenModel):
    """One `text_completion` chunk of a stream, or (`choices` empty) the usage a client asked for."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: dict[str, Any] | None = Absent()
    faithfulness: dict[str, Any] | None = Absent()


class CompletionChunks(ChatChunks):
    """`text_completion` chunks: every text delta is `choices[0].text`, whatever its field; no role."""

    chunk_type = CompletionChunk

    def __init__(self, completion_id: str, model: str) -> None:
        super().__init__(completion_id, model)
        self._sent_role = True  # a completion has none

    def choice(self, delta: dict[str, Any], finish_reason: str | None) -> OpenModel:
        text = "".join(v for v in delta.values() if isinstance(v, str))
        return CompletionChoice(text=text, finish_reason=finish_reason)


class CompletionRenderer(ChatRenderer):
    """`text_completion` chunks out (the chat door's hooks, these chunks), a `text_completion` body."""

    chunk_factory = CompletionChunks
    id_prefix = "cmpl"

    def body(self, answer: Answer, ending: Ending) -> OpenModel:
        text = "".join(answer.text.get(name, "") for name in ("reasoning", "reasoning_content", "content"))
        choice = CompletionChoice(text=text, finish_reason=answer.finish_reason or "stop")
        return Completion(**self.envelope(ending), choices=[choice])


DOOR = Door(
    path=COMPLETIONS_PATH,
    api=Api.OPENAI,
    parse=parse_completions_body,
    renderer=CompletionRenderer,
    off_path=COMPLETIONS_PATH,
    translate=translate,
    messages=prompt_messages,
    hints=False,
    round_wire=COMPLETIONS_WIRE,
    shadow_reader=completions_events,
    request_model=CompletionRequest,
    openapi_responses=openai_responses("A text completion (JSON), or its chunks (SSE) when stream=true.", Completion),
    name="completions",
)
