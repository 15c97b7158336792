"""Scripts: what a fake upstream says to a chat request, before any fault.

A script has a `model` name (served by /v1/models) and answers a parsed request body with `stream`
(stream=true: a `Stream`) or `reply` (stream=false: an `Answer`); either may return an error `Answer`.

- `Sentences`: fixed sentences, one content delta each (the unit tests' healthy vLLM).
- `Counted`: content chunks whose number, delay and holding the request's last message names
  (`chunks=N delay_ms=D hold`), cached as bytes so that a proxy's overhead stands out (benchmarks).
- `Chain` (chains.py): long reasoning chains decoded at a set token rate, with continuations.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from faithproxy.testing.answer import Answer, Hold, Pause, Step, Stream
from faithproxy.testing.wire import DONE, completion, delta, event, text_completion, text_delta, usage_chunk

SENTENCES = ["The image shows a red circle. ", "It is on a white background. ", "So the answer is red."]


class Script(Protocol):
    model: str

    def stream(self, body: dict[str, Any]) -> Stream | Answer: ...

    def reply(self, body: dict[str, Any]) -> Answer: ...


@dataclass(frozen=True)
class Sentences:
    """One delta per sentence in `field` ("content" or "reasoning"), `finish` on the last (None: no
    finish reason), then a usage chunk and [DONE]; `gap_s` pauses before every delta but the first.
    Non-streamed: the sentences joined, or `reply_text` when given. A /v1/completions request (a body
    with a `prompt`) gets the same sentences in the completions wire (`choices[0].text`)."""

    sentences: list[str] = field(default_factory=lambda: list(SENTENCES))
    gap_s: float = 0.0
    field: str = "content"
    finish: str | None = "stop"
    reply_text: str | None = None
    model: str = "m"

    def stream(self, body: dict[str, Any]) -> Stream:
        content: list[Step] = []
        last = len(self.sentences) - 1
        for i, sentence in enumerate(self.sentences):
            if i and self.gap_s:
                content.append(Pause(self.gap_s))
            finish = self.finish if i == last else None
            chunk = text_delta(sentence, finish) if "prompt" in body else delta(sentence, finish, self.field)
            content.append(event(chunk))
        return Stream((), tuple(content), (event(usage_chunk()), DONE))

    def reply(self, body: dict[str, Any]) -> Answer:
        text = "".join(self.sentences) if self.reply_text is None else self.reply_text
        reply = text_completion(text) if "prompt" in body else completion(text)
        return Answer.json(200, json.dumps(reply).encode())

    @classmethod
    def repeating(cls, repeat: int, gap_s: float = 0.0) -> Sentences:
        """SENTENCES with the middle one said `repeat` times: a stream as long as a test needs."""
        return cls([SENTENCES[0], *[SENTENCES[1]] * repeat, SENTENCES[2]], gap_s)


_WORDS = ("The", " red", " cube", " sits", " left", " of", " the", " blue", " sphere", ".")
_CHUNKS = re.compile(rb"chunks=(\d+)")
_DELAY = re.compile(rb"delay_ms=(\d+(?:\.\d+)?)")
_HOLD = re.compile(rb"\bhold\b")
MAX_CHUNKS = 10_000
CREATED = 1_700_000_000


def piece(i: int) -> str:
    return _WORDS[i % len(_WORDS)]


def expected_text(chunks: int) -> str:
    """The content every `Counted` answer with `chunks` content chunks carries."""
    return "".join(piece(i) for i in range(chunks))


def _chunk(model: str, body: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "delta": body, "logprobs": None, "finish_reason": finish}],
    }
    return event(obj, compact=True)


def _usage(chunks: int) -> dict[str, int]:
    return {"prompt_tokens": 16, "completion_tokens": chunks, "total_tokens": 16 + chunks}


@lru_cache(maxsize=256)
def counted_stream(model: str, chunks: int, include_usage: bool) -> Stream:
    """The whole event stream, built once per shape (the hot path only sends bytes)."""
    opening = (_chunk(model, {"role": "assistant", "content": ""}),)
    content = tuple(_chunk(model, {"content": piece(i)}) for i in range(chunks))
    closing = [_chunk(model, {}, finish="stop")]
    if include_usage:
        obj = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": CREATED, "model": model}
        closing.append(event(obj | {"choices": [], "usage": _usage(chunks)}, compact=True))
    closing.append(DONE)
    return Stream(opening, content, tuple(closing))


@lru_cache(maxsize=256)
def counted_body(model: str, chunks: int) -> bytes:
    obj = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": expected_text(chunks)},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(chunks),
    }
    return json.dumps(obj, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Counted:
    """`chunks=N` (default `default_chunks`) content chunks of `expected_text(N)` after a role chunk,
    then a finish chunk, a usage chunk if `stream_options.include_usage`, [DONE]. `delay_ms=D` sleeps
    after each content chunk; `hold` waits after the first while holding is armed. Every proxy forwards
    the messages untouched, so the request controls the answer through its last message's text."""

    default_chunks: int = 8
    model: str = "fake"

    def control(self, body: dict[str, Any]) -> tuple[int, float, bool]:
        messages = body.get("messages") or [{}]
        last = messages[-1] if isinstance(messages[-1], dict) else {}
        content = last.get("content")
        text = json.dumps(content).encode() if not isinstance(content, str) else content.encode()
        chunks = int(m.group(1)) if (m := _CHUNKS.search(text)) else self.default_chunks
        delay = float(m.group(1)) / 1000 if (m := _DELAY.search(text)) else 0.0
        return min(chunks, MAX_CHUNKS), delay, bool(_HOLD.search(text))

    def stream(self, body: dict[str, Any]) -> Stream:
        chunks, delay, hold = self.control(body)
        options = body.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        cached = counted_stream(str(body.get("model") or self.model), chunks, include_usage)
        if not delay and not hold:
            return cached
        content: list[Step] = []
        for i, frame in enumerate(cached.content):
            content.append(frame)
            if hold and i == 0:
                content.append(Hold())
            if delay:
                content.append(Pause(delay))
        return Stream(cached.opening, tuple(content), cached.closing)

    def reply(self, body: dict[str, Any]) -> Answer:
        chunks, delay, _ = self.control(body)
        before = (Pause(delay * chunks),) if delay else ()
        return Answer.json(200, counted_body(str(body.get("model") or self.model), chunks), before=before)
