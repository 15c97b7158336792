"""The detector interface: what a detector checks, returns, and declares to the server."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from faithproxy.detectors.options import DetectorOption
from faithproxy.faithcore.context import CheckResult, RequestView
from faithproxy.faithcore.types import Step

if TYPE_CHECKING:
    from faithproxy.detectors.registry import DetectorDeps


class Detector(abc.ABC):
    """Checks new steps of a chain.

    `check` receives the request's view and the steps completed since the last call (already typed by the
    heuristic typer, perception and reasoning alike) and returns a `CheckResult`: one verdict per step,
    in order, with the generator tokens it spent and the features it read. It writes nothing into the
    view or the steps. A detector that stops at
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
    # Its per-request options (header, key, parser, server setting): the server's header table reads
    # them, so a new option needs no change in server/.
    options: ClassVar[tuple[DetectorOption, ...]] = ()
    # The stages that may decide a step (the cascade: probe, judge), reported through
    # DetectorDeps.on_cascade_decision: the label values of faithproxy_cascade_decisions_total{stage},
    # created at start-up from every registered detector's declaration.
    decision_stages: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> Detector | None:
        """An instance built from what the server has, or None when something it needs is absent (the
        name is then refused per request). `built` holds the detectors registered before this one, for
        detectors made of others (the cascade). The default suits detectors that need nothing."""
        return cls()

    @abc.abstractmethod
    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        """One verdict per step of `new_steps`, in the same order."""

    def validate_request(self, view: RequestView) -> None:  # noqa: B027 - optional hook
        """Raise a PolicyError before anything is sent upstream if this detector cannot serve the request
        (the probe refuses a model it was not trained on)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release pooled connections; called from the server's lifespan."""
