"""What a chain came to: the immutable record a door renders its summary, trace and report from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from faithproxy.faithcore.types import Channel, Step


@dataclass(frozen=True)
class ChainResult:
    """`steps`: every step the client received, in order, with its settled outcome. `usage`: generator
    tokens over every round, check and rewrite of the request. `field_names`: the delta field each
    channel came in (a door names the channel the way the upstream did). `resumes`: how often the chain
    went on after its upstream stream broke."""

    steps: tuple[Step, ...]
    usage: Mapping[str, int]
    regenerations: int
    rounds: int
    upstream_id: str | None
    field_names: Mapping[Channel, str] = field(default_factory=lambda: MappingProxyType({}))
    resumes: int = 0  # rounds started after an upstream break (machine.py: resuming)
