"""Reads one upstream stream ("round") into a queue of steps, running ahead of verification.

The reader is its own task so that decoding never waits for the detector: while step k is being
checked, step k+1 is already being read and segmented. The session cancels the task (which closes the
HTTP connection, and vLLM aborts the generation) when a step fails and the read-ahead must go.
What the items mean is decided by the correction core (server/correction.py), not here.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from faithproxy.clients.vllm import VLLMClient
from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.faithcore.kinds import classify_step
from faithproxy.faithcore.segmenter import THINK_TAGS, StepSegmenter
from faithproxy.faithcore.types import Channel, Step

# Fields of a streamed delta that carry text we segment; everything else is passed on untouched.
TEXT_FIELDS = {"reasoning": Channel.REASONING, "reasoning_content": Channel.REASONING, "content": Channel.CONTENT}
_SKIPPED_DELTA_FIELDS = {"role", *TEXT_FIELDS}


@dataclass
class TextDelta:
    """Text exactly as it arrived (detect mode streams these at once)."""

    channel: Channel
    field: str
    text: str


@dataclass
class ExtraDelta:
    """Delta fields that are not text (tool calls, ...): passed on in order."""

    delta: dict[str, Any]


@dataclass
class TrailingRaw:
    """Whitespace or tags after the last step of a channel (no step of its own)."""

    channel: Channel
    raw: str


@dataclass
class RoundEnd:
    finish_reason: str | None
    usage: dict[str, Any] | None
    first_chunk: dict[str, Any] | None = None


@dataclass
class RoundFailed:
    error: FaithproxyError  # anything else that broke the read is wrapped as an internal error


Item = Step | TextDelta | ExtraDelta | TrailingRaw | RoundEnd | RoundFailed


class ItemQueue:
    """The round's items in order (and, in detect mode, the checker's results), for the session.

    Like an asyncio.Queue with one consumer, except that items of the `quiet` types do not wake it:
    `get` waits until an item of another type is queued, then returns the first item, whatever its
    type. correct mode makes text deltas quiet: the core only counts them, and they are all taken,
    in order, with the next step or at the next drain (`_receive_ready`), so the core sees the same
    items in the same order, but the session's task wakes once per step instead of once per token.
    """

    def __init__(self, quiet: tuple[type, ...] = ()) -> None:
        self._items: deque[Any] = deque()
        self._quiet = quiet
        self._waking = 0  # queued items not of a quiet type
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        if isinstance(item, self._quiet):
            return
        self._waking += 1
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Any:
        """The first item, once an item that wakes is queued."""
        while not self._waking:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.get_nowait()

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        if not isinstance(item, self._quiet):
            self._waking -= 1
        return item

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)


@dataclass
class RoundReader:
    """Reads `body` as a stream and puts Items on `queue`, numbering steps from `first_index`.

    `tags`: the markers that bound steps (the reasoning format's). `in_answer`: the round continues a
    chain after its think block, so every text field is answer text: vLLM 0.32's parsers read that from
    the prompt, but a parser that starts every stream inside the thinking would put the answer in
    `reasoning`. `queue`: an ItemQueue; the session's makes text deltas quiet in correct mode.
    """

    generator: VLLMClient
    body: dict[str, Any]
    first_index: int
    # Items, in order. The session may post its own events into the same queue (detect mode's check
    # results), so that it waits on one queue for whatever comes first.
    queue: ItemQueue = field(default_factory=ItemQueue)
    tags: tuple[str, ...] = THINK_TAGS
    in_answer: bool = False

    def __post_init__(self) -> None:
        self._segmenters = {channel: StepSegmenter(tags=self.tags) for channel in Channel}
        self._next_index = self.first_index
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._first_chunk: dict[str, Any] | None = None

    async def run(self) -> None:
        try:
            async with self.generator.stream_chat(self.body) as stream:
                async for batch in stream.batches():  # what one read brought: resumed once, not per token
                    for chunk in batch:
                        self._on_chunk(chunk)
            for channel in (Channel.REASONING, Channel.CONTENT):
                self._flush(channel)
            self.queue.put_nowait(RoundEnd(self._finish_reason, self._usage, self._first_chunk))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the session, which owns error policy
            self.queue.put_nowait(RoundFailed(_as_faithproxy_error(exc)))

    def _on_chunk(self, chunk: dict[str, Any]) -> None:
        if self._first_chunk is None:
            self._first_chunk = chunk
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for name, parsed_channel in TEXT_FIELDS.items():
                text = delta.get(name)
                if isinstance(text, str) and text:
                    field_name, channel = ("content", Channel.CONTENT) if self.in_answer else (name, parsed_channel)
                    if channel is Channel.CONTENT:
                        # Thinking is over once the answer starts: its last sentence is complete.
                        self._flush(Channel.REASONING)
                    self.queue.put_nowait(TextDelta(channel, field_name, text))
                    for segment in self._segmenters[channel].feed(text):
                        self._put_step(channel, segment.text, segment.raw)
            if not delta.keys() <= _SKIPPED_DELTA_FIELDS:  # a text delta (nearly all of them) has no extras
                extra = {k: v for k, v in delta.items() if k not in _SKIPPED_DELTA_FIELDS and v not in (None, [], "")}
                if extra:
                    self.queue.put_nowait(ExtraDelta(extra))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]

    def _flush(self, channel: Channel) -> None:
        for segment in self._segmenters[channel].flush():
            if segment.text:
                self._put_step(channel, segment.text, segment.raw)
            elif segment.raw:
                self.queue.put_nowait(TrailingRaw(channel, segment.raw))

    def _put_step(self, channel: Channel, text: str, raw: str) -> None:
        step = Step(index=self._next_index, text=text, raw=raw, channel=channel, kind=classify_step(text))
        self._next_index += 1
        self.queue.put_nowait(step)


def _as_faithproxy_error(exc: BaseException) -> FaithproxyError:
    if isinstance(exc, FaithproxyError):
        return exc
    return FaithproxyError(f"internal error while reading upstream: {type(exc).__name__}")
