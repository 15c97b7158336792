"""The detector interface and the context every detector receives."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.types import Step, Verdict

if TYPE_CHECKING:
    from faithproxy.detectors.registry import DetectorDeps


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
    # Capabilities, declared here and asked for by the server (which never tells detectors apart by name):
    # True when the detector types steps itself (the judge does): the session then sends it every new
    # step, so that a step the keyword heuristic mistook for reasoning is still checked.
    types_steps: ClassVar[bool] = False
    # True when it reads the generator's hidden states itself (probe, cascade): the server then does not
    # record features for the trace on the side, since the detector already has them.
    reads_hidden_states: ClassVar[bool] = False
    # True when it calls a server-configured judge: a request must then name one (or the server have a
    # default), and the judge's image policy applies.
    uses_judge: ClassVar[bool] = False
    # True when its verdicts carry information (`none` passes every step unchecked: its UNKNOWN verdicts
    # are counted with reason `detector_none`, not as detector errors).
    checks: ClassVar[bool] = True

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> Detector | None:
        """An instance built from what the server has, or None when something it needs is absent (the
        name is then refused per request). `built` holds the detectors registered before this one, for
        detectors made of others (the cascade). The default suits detectors that need nothing."""
        return cls()

    @abc.abstractmethod
    async def check(self, ctx: ChainContext, new_steps: list[Step]) -> list[Verdict]:
        """One verdict per step of `new_steps`, in the same order."""

    def validate_request(self, ctx: ChainContext) -> None:  # noqa: B027 - optional hook
        """Raise a PolicyError before anything is sent upstream if this detector cannot serve the request
        (the probe refuses a model it was not trained on)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release pooled connections; called from the server's lifespan."""
