"""One upstream round, from deltas to steps: the machine's reader, pure and synchronous.

`RoundParser.feed(delta)` maps the delta's field to a channel, cuts the channel's text into steps with
the step segmenter (faithcore/segmenter.py) and types each step (faithcore/kinds.py, or the typer the
rules name); `end()` flushes what is left. Steps come out unnumbered (index -1): the machine numbers a
step once, when it reaches the client. Any split of the same text gives the same steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from faithproxy.faithcore.types import Channel, Segment, Step, StepKind

# Fields of a streamed delta that carry text we segment; everything else is passed on untouched.
TEXT_FIELDS = {"reasoning": Channel.REASONING, "reasoning_content": Channel.REASONING, "content": Channel.CONTENT}
UNNUMBERED = -1  # a step's index until it reaches the client


@dataclass(frozen=True, slots=True)
class TrailingRaw:
    """Whitespace or tags after the last step of a channel (no step of its own)."""

    channel: Channel
    raw: str


class SegmenterLike(Protocol):
    """What the parser needs of a segmenter (faithcore.segmenter.StepSegmenter is the real one)."""

    def feed(self, text: str) -> list[Segment]: ...

    def flush(self) -> list[Segment]: ...

    def settled_lead(self) -> str: ...


class RoundParser:
    """Cuts one round's text deltas into steps, per channel.

    `in_answer`: the round continues a chain after its think block, so every text field is answer text:
    vLLM 0.32's parsers read that from the prompt, but a parser that starts every stream inside the
    thinking would put the answer in `reasoning`.
    """

    def __init__(
        self,
        segmenter: Callable[[], SegmenterLike],
        typer: Callable[[str], StepKind],
        *,
        in_answer: bool = False,
    ) -> None:
        self._segmenters = {channel: segmenter() for channel in Channel}
        self._typer = typer
        self.in_answer = in_answer

    def channel_of(self, field: str) -> tuple[str, Channel] | None:
        """The (field, channel) a text delta of `field` belongs to; None for a field that is not text."""
        channel = TEXT_FIELDS.get(field)
        if channel is None:
            return None
        return ("content", Channel.CONTENT) if self.in_answer else (field, channel)

    def feed(self, channel: Channel, text: str) -> list[Step | TrailingRaw]:
        """The steps `text` completed. Thinking is over once the answer starts: its last sentence is
        complete, so content text flushes the reasoning channel first."""
        out = self._flush(Channel.REASONING) if channel is Channel.CONTENT else []
        for segment in self._segmenters[channel].feed(text):
            out.append(self._step(channel, segment))
        return out

    def read_past_last_step(self) -> list[TrailingRaw]:
        """What a round stopped now had read after its last whole step and that a continuation carries:
        the whitespace and tags that can only precede the next step, cut where the model's tokenizer
        most likely cut.

        Continuing from the bare step would make the model write those characters again from a token
        boundary it never produced: BPE tokenizers of the GPT-2 kind (Qwen, Llama 3) fold newlines
        into the token of the punctuation before them (".\n") and put a space in front of the next
        word (" The"). A model that ended a sentence with ".\n" and then "</think>" was seen, given
        the sentence back ending in ".", to end its reply at once. So newlines and tags are kept and
        the spaces after the last of them are left to the next round."""
        out = []
        for channel, segmenter in self._segmenters.items():
            lead = segmenter.settled_lead().rstrip(" \t")
            if lead:
                out.append(TrailingRaw(channel, lead))
        return out

    def end(self) -> list[Step | TrailingRaw]:
        return [*self._flush(Channel.REASONING), *self._flush(Channel.CONTENT)]

    def _flush(self, channel: Channel) -> list[Step | TrailingRaw]:
        out: list[Step | TrailingRaw] = []
        for segment in self._segmenters[channel].flush():
            if segment.text:
                out.append(self._step(channel, segment))
            elif segment.raw:
                out.append(TrailingRaw(channel, segment.raw))
        return out

    def _step(self, channel: Channel, segment: Segment) -> Step:
        kind = self._typer(segment.text)
        return Step(index=UNNUMBERED, text=segment.text, raw=segment.raw, channel=channel, kind=kind)
