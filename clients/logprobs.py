"""Token log-probabilities of a judge's reply, as OpenAI-compatible servers return them.

A chat completion asked with `logprobs: true, top_logprobs: k` carries, for every generated token, the
token's text, its log-probability and the k likeliest tokens at that position
(`choices[0].logprobs.content`); a stream carries the same entries spread over its chunks. vLLM also
lists tokens the reply text leaves out (the end-of-turn token), so readers work on the tokens'
concatenation, not on the message text. The judge detector reads its confidence from these
(detectors/judge_confidence.py); the backends only move them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenChoice:
    """One generated token: its text, its log-probability, and the alternatives the server listed at
    its position (token, log-probability), the chosen one usually among them."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _entries(entries: Iterable[Any] | None) -> list[TokenChoice]:
    out = []
    for entry in entries or ():
        top = tuple((str(_get(a, "token")), float(_get(a, "logprob"))) for a in _get(entry, "top_logprobs") or ())
        out.append(TokenChoice(str(_get(entry, "token")), float(_get(entry, "logprob")), top))
    return out


def completion_tokens(reply: Any) -> tuple[TokenChoice, ...] | None:
    """The tokens of a chat completion (an SDK object or its JSON); None when it has no log-probabilities."""
    choices = _get(reply, "choices") or []
    logprobs = _get(choices[0], "logprobs") if choices else None
    content = _get(logprobs, "content") if logprobs is not None else None
    return tuple(_entries(content)) if content else None


def stream_tokens(chunks: Iterable[Any]) -> tuple[TokenChoice, ...] | None:
    """The tokens of a streamed chat completion, from its chunks in order; None when none had any."""
    out: list[TokenChoice] = []
    for chunk in chunks:
        choices = _get(chunk, "choices") or []
        logprobs = _get(choices[0], "logprobs") if choices else None
        out += _entries(_get(logprobs, "content") if logprobs is not None else None)
    return tuple(out) or None
