"""What the correction machine asks its driver to do, one action at a time.

Emit* go to the client (the door renders them in its own wire format); StartRound / DropRound open and
close an upstream stream; Check and Regenerate ask for a detector or regenerator call whose result comes
back as an event; the notes (RegenerationNote, ResumeNote) report a regeneration try's outcome and an
upstream break, for the driver to count; Fail ends the request with an error after whatever was
emitted; WAIT means nothing can be done before the next event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faithproxy.faithcore.outcomes import ResumeOutcome, TryOutcome
from faithproxy.faithcore.reasoning_formats import Continuation
from faithproxy.faithcore.types import Channel, Step


@dataclass(frozen=True)
class EmitText:
    """Text for the client: a whole verified step (correct mode) or a raw delta (detect mode)."""

    channel: Channel
    field: str
    text: str
    step: Step | None = None  # the step this text completes, for its annotation


@dataclass(frozen=True)
class EmitExtra:
    delta: dict[str, Any]


@dataclass(frozen=True)
class EmitVerdicts:
    """detect mode: verdicts for steps whose text was already sent."""

    steps: tuple[Step, ...]


@dataclass(frozen=True)
class EmitEnd:
    finish_reason: str | None


Emit = EmitText | EmitExtra | EmitVerdicts | EmitEnd


@dataclass(frozen=True)
class StartRound:
    """Open an upstream stream. `prefix` is None for the first round; for a continuation it is the raw
    text per channel the client has received (the round writes on after it), `continuation` the partial
    assistant message the reasoning format makes of it and whether the round starts after the think
    block, and `max_tokens` what is left of the client's completion budget (None: the client set none)."""

    prefix: dict[Channel, str] | None = None
    max_tokens: int | None = None
    continuation: Continuation | None = None


@dataclass(frozen=True)
class DropRound:
    """Close the current upstream stream (vLLM aborts the generation); what it read ahead is gone."""


@dataclass(frozen=True)
class Check:
    """Send `steps` to the detector (one call). `candidate`: a regenerated step being re-checked.
    `accepted`: the steps accepted before them, the context the detector may read."""

    steps: list[Step]
    candidate: bool = False
    accepted: tuple[Step, ...] = ()


@dataclass(frozen=True)
class Regenerate:
    step: Step
    prefix: list[str]  # the accepted steps' text
    attempt: int  # from 1
    accepted: tuple[Step, ...] = ()


# Notes: facts the machine reports for the driver to count and record; they ask for nothing.


@dataclass(frozen=True)
class RegenerationNote:
    """A regeneration try of `step` ended (`attempt` counts from 1)."""

    step: Step
    attempt: int
    outcome: TryOutcome


@dataclass(frozen=True)
class ResumeNote:
    """The upstream stream broke mid-round (`error`): RESUMED (the StartRound follows; `attempt` counts
    from 1) or EXHAUSTED (the Fail follows)."""

    attempt: int
    outcome: ResumeOutcome
    error: BaseException


Note = RegenerationNote | ResumeNote


@dataclass(frozen=True)
class Fail:
    """The request fails with `error` (after whatever was emitted before)."""

    error: BaseException


class _Wait:
    def __repr__(self) -> str:
        return "WAIT"


WAIT = _Wait()  # nothing to do until the next event is received

Action = Emit | StartRound | DropRound | Check | Regenerate | Note | Fail | _Wait
