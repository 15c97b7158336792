"""vLLM's OpenAI chat-completions wire, as bytes and dicts: the frames a fake upstream sends and the
helpers a test reads a proxy's answer with.

A streamed answer is `data: {chunk}\n\n` events: `choices[0].delta` carries `content` (or, for a
reasoning model, `reasoning`), the last content chunk (or a chunk of its own) a `finish_reason`, then a
chunk with `choices: []` and `usage`, then `data: [DONE]`. A non-streamed answer is one
`chat.completion` JSON body.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def event(obj: object, *, compact: bool = False) -> bytes:
    """One SSE event carrying `obj` as JSON."""
    text = json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj)
    return b"data: " + text.encode() + b"\n\n"


def sse(*objs: object, done: bool = True) -> bytes:
    """The events of `objs`, then `data: [DONE]` unless `done` is False (a stream cut short)."""
    out = b"".join(event(o) for o in objs)
    return out + (DONE if done else b"")


def delta(text: str, finish: str | None = None, field: str = "content") -> dict[str, Any]:
    """A chunk whose delta carries `text` in `field` ("content" or "reasoning")."""
    return {
        "id": "u1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {field: text}, "finish_reason": finish}],
    }


def text_delta(text: str, finish: str | None = None) -> dict[str, Any]:
    """A /v1/completions chunk carrying `text` in `choices[0].text`."""
    return {"id": "u1", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def text_completion(text: str) -> dict[str, Any]:
    """A non-streamed /v1/completions answer of one choice."""
    return {
        "id": "u1",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def usage_chunk(prompt_tokens: int = 5, completion_tokens: int = 3) -> dict[str, Any]:
    """The chunk vLLM sends after the last choice when the request asks for usage."""
    return {
        "id": "u1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }


def completion(text: str) -> dict[str, Any]:
    """A non-streamed answer of one choice."""
    return {
        "id": "u1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def error_body(message: str, kind: str) -> bytes:
    """vLLM's error body (OpenAI's shape)."""
    return json.dumps({"error": {"message": message, "type": kind}}).encode()


def frames(text: str) -> list[str]:
    """The `data:` payloads of an event stream, `[DONE]` included, in order."""
    return [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
