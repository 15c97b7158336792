"""The regenerator interface."""

from __future__ import annotations

import abc
from typing import ClassVar

from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.types import Step


class Regenerator(abc.ABC):
    """Rewrites one unfaithful step given the accepted prefix.

    Returns the new sentence, or None when the try produced nothing usable (counted as a failed try).
    Transport failures raise RegenerationError.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    async def regenerate(self, ctx: ChainContext, prefix: list[str], bad_step: Step, attempt: int) -> str | None:
        """`attempt` counts from 1."""
