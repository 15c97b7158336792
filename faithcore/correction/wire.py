"""An OpenAI chat-completions stream chunk (as vLLM sends it) read as the machine's events.

One wire format per door: a door whose upstream speaks another (completions' `choices[0].text`) adds
its own reader beside this one; the machine sees the same `Delta`s. Only choice 0 is read (the proxy
refuses n > 1 outside off mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faithproxy.faithcore.correction.events import Delta, Extras, RoundEnd
from faithproxy.faithcore.correction.rounds import TEXT_FIELDS

_SKIPPED_DELTA_FIELDS = frozenset({"role", *TEXT_FIELDS})


@dataclass
class ChatChunkReader:
    """Reads one round's chunks: `events(chunk)` gives the deltas and extras of a chunk in order and
    remembers its finish reason, usage and response id for `end()`."""

    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    upstream_id: str | None = None
    _seen: bool = False

    def events(self, chunk: dict[str, Any]) -> list[Delta | Extras]:
        if not self._seen:
            self._seen = True
            self.upstream_id = chunk.get("id")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        out: list[Delta | Extras] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) == 0:
                self._choice(choice, out)
        return out

    def _choice(self, choice: dict[str, Any], out: list[Delta | Extras]) -> None:
        delta = choice.get("delta") or {}
        for name in TEXT_FIELDS:
            text = delta.get(name)
            if isinstance(text, str) and text:
                out.append(Delta(name, text))
        if not delta.keys() <= _SKIPPED_DELTA_FIELDS:  # a text delta (nearly all of them) has no extras
            extra = {k: v for k, v in delta.items() if k not in _SKIPPED_DELTA_FIELDS and v not in (None, [], "")}
            if extra:
                out.append(Extras(extra))
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def end(self) -> RoundEnd:
        return RoundEnd(self.finish_reason, self.usage, self.upstream_id)


@dataclass
class CompletionChunkReader(ChatChunkReader):
    """Reads a /v1/completions stream: `choices[0].text` is the round's text, as `content` (a raw
    prompt has no reasoning parser between the model and the proxy; think markers stay in the text,
    where the reasoning format finds them)."""

    def _choice(self, choice: dict[str, Any], out: list[Delta | Extras]) -> None:
        text = choice.get("text")
        if isinstance(text, str) and text:
            out.append(Delta("content", text))
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
