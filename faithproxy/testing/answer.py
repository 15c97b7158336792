"""What a fake upstream answers, as plain data: a status, a content type and a list of steps that a
player (the ASGI app or the MockTransport handler in upstream.py) carries out.

A step is bytes to send or one of the timed or failing steps below. A streamed answer keeps its parts
apart (`opening`, `content`, `closing`) so that a fault can cut it after its first content frames
(faults.py) whatever script wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pause:
    """Sleep this long (a delay between frames, a time to first token)."""

    seconds: float


@dataclass(frozen=True)
class At:
    """Sleep until `seconds` after the last Pause ended: pacing that sleeping's overshoot cannot add
    up in (a decoder emitting one token every `token_s`)."""

    seconds: float


@dataclass(frozen=True)
class Hold:
    """Wait here while holding is armed (`FakeUpstream.arm`), at most `limit_s`: streams kept open as
    long as a measurement needs."""

    limit_s: float = 120.0


@dataclass(frozen=True)
class Stall:
    """Send nothing until the fake is released (`FakeUpstream.release`) or the client goes; a client
    that goes counts in `FakeUpstream.aborted`, as vLLM aborts a generation nobody reads."""


@dataclass(frozen=True)
class Reset:
    """The connection drops without the end of the body (a vLLM that died)."""


Step = bytes | Pause | At | Hold | Stall | Reset


@dataclass(frozen=True)
class Stream:
    """An event stream in three parts: a fault keeps the opening and the first content frames."""

    opening: tuple[Step, ...] = ()
    content: tuple[Step, ...] = ()
    closing: tuple[Step, ...] = ()

    def steps(self) -> tuple[Step, ...]:
        return self.opening + self.content + self.closing

    def first_frames(self, count: int) -> tuple[Step, ...]:
        """The opening and the content up to its `count`-th frame (pauses between them kept)."""
        kept: list[Step] = []
        sent = 0
        for step in self.content:
            if sent == count:
                break
            kept.append(step)
            sent += isinstance(step, bytes)
        return self.opening + tuple(kept)


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: `before` runs ahead of the status line (a stall before headers, the time a
    non-streamed answer takes), then the status, then `body` step by step."""

    status: int = 200
    content_type: str = "application/json"
    body: tuple[Step, ...] = ()
    before: tuple[Step, ...] = field(default=())

    @classmethod
    def json(cls, status: int, body: bytes, *, before: tuple[Step, ...] = ()) -> Answer:
        return cls(status, "application/json", (body,), before)

    @classmethod
    def stream(cls, stream: Stream | tuple[Step, ...]) -> Answer:
        steps = stream.steps() if isinstance(stream, Stream) else stream
        return cls(200, "text/event-stream", steps)
