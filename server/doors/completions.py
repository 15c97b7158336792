"""POST /v1/completions served by the correction machine: a raw prompt, verified like a chat.

The client rendered the chat template itself, so there is none to continue through: a continuation
round sends the client's prompt with the accepted text appended (`completions_round_body`), and vLLM's
`/v1/completions` decodes on from there. Its chunks (`choices[0].text`) are read by
`CompletionChunkReader` (faithcore/correction/wire.py) into the same `Delta("content", ...)` events a
chat stream gives, so the machine, the driver (server/chain/session.py) and the accounting
(`ChatServing`, server/observe/traces.py) are the chat door's own; only the wire and the rendering differ:
emits go out as `text_completion` chunks, and the `faithfulness` object rides beside `choices`, as it
does on chat chunks.

What a raw prompt can ask that a verified chain cannot give (token-id prompts, several prompts,
`echo`, `logprobs`, `suffix`, `best_of`, hints) is refused with a 400 in `detect` and `correct`;
`off` passes every body vLLM takes straight through (server/doors/off.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from fastapi.responses import Response

from faithproxy.clients.vllm import COMPLETIONS_PATH
from faithproxy.faithcore.correction import StartRound
from faithproxy.faithcore.correction.wire import CompletionChunkReader
from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.reasoning_formats import ReasoningFormat
from faithproxy.faithcore.types import Channel
from faithproxy.server.chain.session import RoundWire
from faithproxy.server.doors.serving import ChatServing
from faithproxy.server.protocol.sse import ChunkFactory, frame

# Fields that change what a completion is beyond one chain of text; `off` passes them through.
_CORRECTING_REFUSES = ("echo", "logprobs", "suffix", "best_of", "prompt_logprobs")


def prompt_text(body: dict[str, Any]) -> str | None:
    """The one text prompt of a completions body (a string, or a list holding one string), else None."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


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
    reader=CompletionChunkReader,
    reasoning_format=_raw_prompt_format,
)


class CompletionChunks(ChunkFactory):
    """`text_completion` chunks: every text delta is `choices[0].text`, whatever its field."""

    def __init__(self, completion_id: str, model: str) -> None:
        self.id = completion_id
        self.model = model
        self.created = int(time.time())

    def text_frame(self, field: str, text: str) -> bytes:
        return frame(self.chunk({field: text}))

    def chunk(
        self, delta: dict[str, Any], *, finish_reason: str | None = None, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        text = "".join(v for v in delta.values() if isinstance(v, str))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        body: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if extra:
            body.update(extra)  # "faithfulness": the OpenAI SDK keeps unknown fields
        return body

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        chunk = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}
        return {**chunk, "choices": [], "usage": usage}


class CompletionServing(ChatServing):
    """Serves one admitted /v1/completions request through the chat door's session and accounting."""

    wire = COMPLETIONS_WIRE
    object_id_prefix = "cmpl"

    async def respond(self) -> Response:
        if self.policy.mode != "off":
            self._refuse_unsupported()
        return await super().respond()

    def _refuse_unsupported(self) -> None:
        mode = self.policy.mode
        if prompt_text(self.body) is None:
            raise PolicyError(
                f"'prompt' must be one string in {mode} mode (token ids and several prompts pass through "
                "with X-Faithproxy-Mode: off)",
                param="prompt",
            )
        for name in _CORRECTING_REFUSES:
            value = self.body.get(name)
            if value is not None and value is not False and not (name == "best_of" and value == 1):
                raise PolicyError(
                    f"'{name}' is not supported on /v1/completions in {mode} mode (X-Faithproxy-Mode: off "
                    "passes it through)",
                    param=name,
                )
        if self.policy.hints:
            raise PolicyError(
                "X-Faithproxy-Hints is supported on /v1/chat/completions only", param="x-faithproxy-hints"
            )

    def _messages(self) -> list[dict[str, Any]]:
        """The prompt as one user message: what detectors, judges and the regenerator read."""
        return [{"role": "user", "content": prompt_text(self.body) or ""}]

    def _chunks(self) -> ChunkFactory:
        return CompletionChunks(f"{self.object_id_prefix}-{self.request_id}", self.body["model"])

    def _body(self, finish_reason: str | None, extras: dict[str, Any]) -> dict[str, Any]:
        assert self.session is not None
        text = "".join(self.answer.get(name, "") for name in ("reasoning", "reasoning_content", "content"))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason or "stop"}
        return {
            "id": f"{self.object_id_prefix}-{self.request_id}",
            "object": "text_completion",
            "created": int(self.started_wall),
            "model": self.body["model"],
            "choices": [choice],
            "usage": dict(self.session.result().usage),
            **self._judge_usage(),
            "faithfulness": self._summary(),
        }
