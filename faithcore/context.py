"""The per-request record every detector and regenerator receives: what they may know of the request.

It lives at the bottom of the house (faithcore) because the server builds it, detectors read it and
regenerators read it too: none of them should have to import another's module to get it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
