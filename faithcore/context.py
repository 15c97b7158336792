"""The per-request record every detector and regenerator receives: what they may know of the request.

It lives at the bottom of the house (faithcore) because the server builds it, detectors read it and
regenerators read it too: none of them should have to import another's module to get it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from faithproxy.faithcore.images import ImageRef
from faithproxy.faithcore.types import Step


@dataclass
class Usage:
    """Token usage added up over every upstream call a request makes."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, usage: dict[str, Any] | None) -> None:
        if usage:
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


@dataclass
class ChainContext:
    """What a detector or regenerator may know about the request being checked."""

    request_id: str
    model: str
    messages: list[dict[str, Any]]
    question: str
    images: list[ImageRef]
    accepted: list[Step] = field(default_factory=list)  # steps already verified, in order
    # The generator's client (a clients.vllm.VLLMClient), for detectors and regenerators that ask the
    # generator itself; typed loosely so that this bottom layer does not import clients/.
    generator: Any = None
    judge: str | None = None  # name of a server-configured judge
    usage: Usage = field(default_factory=Usage)  # generator tokens spent on checks and rewrites
    options: dict[str, Any] = field(default_factory=dict)  # detector-specific per-request settings
    # The judge's per-request state (description, cache splits, bill): shared by every copy a detector
    # makes of the context (the cascade does), since it is one object.
    judge_state: JudgeState = field(default_factory=JudgeState)
