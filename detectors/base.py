"""The detector interface and the context every detector receives."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from faithcore.images import ImageRef
from faithcore.types import Step, Verdict

if TYPE_CHECKING:  # the generator client is only needed by detectors that ask the generator itself
    from clients.vllm import VLLMClient


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
class ChainContext:
    """What a detector or regenerator may know about the request being checked."""

    request_id: str
    model: str
    messages: list[dict[str, Any]]
    question: str
    images: list[ImageRef]
    accepted: list[Step] = field(default_factory=list)  # steps already verified, in order
    generator: VLLMClient | None = None
    judge: str | None = None  # name of a server-configured judge
    usage: Usage = field(default_factory=Usage)  # generator tokens spent on checks and rewrites
    options: dict[str, Any] = field(default_factory=dict)  # detector-specific per-request settings


class Detector(abc.ABC):
    """Checks new steps of a chain.

    `check` receives the steps completed since the last call (already typed by the heuristic typer,
    perception and reasoning alike) and returns one verdict per step, in order. A detector that stops at
    the first unfaithful step (the judge does) returns UNKNOWN for the steps after it: they will be
    read again after the correction. Failures raise `DetectorError`; the session applies the request's
    policy (pass and count as unchecked, or fail the request).
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    # True when the detector types steps itself (the judge does): the session then sends it every new
    # step, so that a step the keyword heuristic mistook for reasoning is still checked.
    types_steps: ClassVar[bool] = False

    @abc.abstractmethod
    async def check(self, ctx: ChainContext, new_steps: list[Step]) -> list[Verdict]:
        """One verdict per step of `new_steps`, in the same order."""

    def validate_request(self, ctx: ChainContext) -> None:  # noqa: B027 - optional hook
        """Raise a PolicyError before anything is sent upstream if this detector cannot serve the request
        (the probe refuses a model it was not trained on)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release pooled connections; called from the server's lifespan."""
