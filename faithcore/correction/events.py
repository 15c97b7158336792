"""What the correction machine is told: upstream data of the current round, and the results of its asks.

Upstream events are plain data, as a door's wire parser reads them (faithcore/correction/wire.py for
chat completions): a `Delta` is text and the name of the field it came in (`reasoning`,
`reasoning_content`, `content`); `Extras` are the other fields of a delta (tool calls, ...), passed on in
order. The machine never sees a chunk, a socket or a queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faithproxy.faithcore.context import Usage
from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.faithcore.types import Verdict


@dataclass(frozen=True, slots=True)
class Delta:
    """Text of the current round, exactly as it arrived, and the delta field it came in."""

    field: str
    text: str


@dataclass(frozen=True, slots=True)
class Extras:
    """Delta fields that are not text (tool calls, ...)."""

    delta: dict[str, Any]


@dataclass(frozen=True)
class RoundEnd:
    """The round's stream ended: its finish reason, vLLM's usage of the round, the upstream's response id."""

    finish_reason: str | None
    usage: dict[str, Any] | None = None
    upstream_id: str | None = None


@dataclass(frozen=True)
class RoundFailed:
    """The round's stream broke (anything else that broke the read is wrapped as a FaithproxyError)."""

    error: FaithproxyError


UpstreamEvent = Delta | Extras | RoundEnd | RoundFailed


@dataclass(frozen=True)
class Checked:
    """The detector's answer to the last Check: one verdict per step, or the error of the call.

    `usage`: generator tokens the check spent (self-assessment asks the generator); `features`: the
    hidden-state features read for each step, when they were (traces keep them for probe training)."""

    verdicts: list[Verdict] | None = None
    error: BaseException | None = None
    usage: Usage | None = None
    features: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Regenerated:
    """The regenerator's answer to the last Regenerate: a candidate, None (nothing usable), or an error."""

    candidate: str | None = None
    error: BaseException | None = None
    usage: Usage | None = None
    insisted: bool = False  # the model restated the flagged step: keep it, try no more (residual "insisted")


Event = UpstreamEvent | Checked | Regenerated
