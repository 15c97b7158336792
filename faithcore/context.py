"""The per-request view every detector and regenerator receives, and what their calls return.

It lives at the bottom of the house (faithcore) because the server builds it, detectors read it and
regenerators read it too: none of them should have to import another's module to get it. The view is
frozen: a detector reports what it found and spent in its `CheckResult`, a regenerator in its
`Regeneration`, and the driver (which alone owns the request's totals) adds them up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from faithproxy.faithcore.images import ImageRef
from faithproxy.faithcore.reasoning_formats import ReasoningFormat
from faithproxy.faithcore.types import Step, Verdict


@dataclass
class Usage:
    """Token usage added up over every upstream call a request makes."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, usage: Mapping[str, Any] | Usage | None) -> None:
        """Adds an upstream reply's `usage` object, or another Usage (a check's or a rewrite's)."""
        if isinstance(usage, Usage):
            self.prompt_tokens += usage.prompt_tokens
            self.completion_tokens += usage.completion_tokens
        elif usage:
            self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.completion_tokens += int(usage.get("completion_tokens") or 0)

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass
class JudgeUsage:
    """What judge calls cost: calls and tokens, the prompt's split three ways as the vendors bill it.

    `input_tokens` are prompt tokens processed at the full price (neither read from nor written to a
    prompt cache), `cached_input_tokens` were read from the judge's prompt cache, `cache_creation_tokens`
    were written to it (Anthropic bills them above the full price; vLLM reports none). The three add up
    to the whole prompt.
    """

    calls: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_creation_tokens: int = 0
    output_tokens: int = 0

    def add(self, other: JudgeUsage) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cached_input_tokens + self.cache_creation_tokens

    @property
    def budget_tokens(self) -> int:
        """The tokens a judge budget counts: all but cache reads, which cost a tenth and take no
        prefill time, so a long, well-cached chain is not cut short for context it already paid for."""
        return self.input_tokens + self.cache_creation_tokens + self.output_tokens

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class JudgeState:
    """The judge's record of one request, kept for as long as the request lives.

    `description` is the judge's own description of the request's image(s), asked for once and then
    part of every later prompt; `descriptions` counts how many the judge wrote during the request (the
    goal is at most one). `splits` are the chain positions where earlier prompts of the request ended a
    content block: later prompts cut the chain at the same places, so a prompt cache that keys on block
    boundaries (Anthropic's) finds the earlier prefixes. `budget_steps` counts the perception steps that
    passed unchecked because the request's judge budget was spent. `on_call` (set by the server) is told
    the usage of every call as it returns, for the metrics.
    """

    usage: JudgeUsage = field(default_factory=JudgeUsage)
    description: str | None = None
    descriptions: int = 0
    splits: set[int] = field(default_factory=set)
    budget_steps: int = 0
    on_call: Callable[[str, JudgeUsage], None] | None = field(default=None, repr=False)

    def record(self, judge: str, call: JudgeUsage) -> None:
        self.usage.add(call)
        if self.on_call is not None:
            self.on_call(judge, call)

    def summary(self) -> dict[str, int]:
        """The bill as the `faithfulness` summary and the trace show it."""
        return {**self.usage.as_dict(), "descriptions": self.descriptions, "budget_steps": self.budget_steps}


def _read_only(options: Mapping[str, Any]) -> Mapping[str, Any]:
    return options if isinstance(options, MappingProxyType) else MappingProxyType(dict(options))


@dataclass(frozen=True)
class RequestView:
    """What a detector or regenerator may know of the request being checked: a frozen record.

    Nothing is written through it. The driver builds one per request and a new one whenever the accepted
    steps change (`with_accepted`); services a detector needs (the generator, hidden states) are handed to
    it when it is built, never carried here. The one mutable part is `judge_state`, the judge's own memo
    of this request (its image description, cache cuts, bill, budget count): the judge alone writes it,
    and every view made from this one shares it.
    """

    request_id: str
    model: str
    messages: list[dict[str, Any]]
    question: str
    images: tuple[ImageRef, ...] = ()
    accepted: tuple[Step, ...] = ()  # steps already verified, in order (the driver fills it)
    judge: str | None = None  # name of a server-configured judge
    # Detector options given per request (`DetectorOption.key` → value, from the headers), read-only.
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # The request's reasoning format, so that a hidden-state capture renders the chain with the think
    # markers the model saw; None: the default (`think`).
    reasoning_format: ReasoningFormat | None = None
    judge_state: JudgeState = field(default_factory=JudgeState)
    # True while the steps checked are a rewrite's candidate (one regeneration try), not the model's own
    # draft: a detector may check those differently (the cascade can hand them to its judge).
    rewrite: bool = False

    def __post_init__(self) -> None:
        # Lists handed in become tuples, a dict of options a read-only mapping: a detector cannot change
        # what the next check or the driver sees, even by mistake.
        object.__setattr__(self, "images", tuple(self.images))
        object.__setattr__(self, "accepted", tuple(self.accepted))
        object.__setattr__(self, "options", _read_only(self.options))

    def with_accepted(self, steps: Iterable[Step]) -> RequestView:
        """The same request with `steps` as the accepted prefix (the judge state is shared)."""
        return replace(self, accepted=tuple(steps))


@dataclass(frozen=True)
class CheckResult:
    """What one `Detector.check` found: one verdict per step, in order, and what it cost and read.

    `usage`: generator tokens the check spent (the prompt detector asks the generator); the driver adds
    them to the request's. `features`: one entry per step when the detector read hidden-state features
    (the probe, the cascade), None for a step it read none for; None when it read none at all. The driver
    puts them on the steps for the trace.
    """

    verdicts: tuple[Verdict, ...]
    usage: Usage = field(default_factory=Usage)
    features: tuple[Any | None, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdicts", tuple(self.verdicts))
        if self.features is not None:
            object.__setattr__(self, "features", tuple(self.features))


@dataclass(frozen=True)
class Regeneration:
    """One rewrite try: the candidate sentence (None: nothing usable, a failed try) and the generator
    tokens it spent."""

    candidate: str | None
    usage: Usage = field(default_factory=Usage)
    # The generator's samples mostly restated the flagged sentence (ReflectRegenerator's `insist_share`):
    # it is sure where the detector flagged it, so the step is kept without spending the other tries.
    insisted: bool = False
