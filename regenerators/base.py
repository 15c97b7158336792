"""The regenerator interface."""

from __future__ import annotations

import abc
from typing import ClassVar

from faithproxy.faithcore.context import Regeneration, RequestView
from faithproxy.faithcore.types import Step


class Regenerator(abc.ABC):
    """Rewrites one unfaithful step given the accepted prefix.

    Returns a `Regeneration`: the new sentence, or None when the try produced nothing usable (counted as
    a failed try), and the generator tokens the try spent. It writes nothing into the view. Transport
    failures raise RegenerationError. Services (the generator's client) are given at construction.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    async def regenerate(self, view: RequestView, prefix: list[str], bad_step: Step, attempt: int) -> Regeneration:
        """`attempt` counts from 1."""
