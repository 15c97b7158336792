"""The detector interface: what a detector checks, returns, and declares to the server."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from faithproxy.detectors.options import DetectorOption
from faithproxy.faithcore.context import CheckResult, RequestView
from faithproxy.faithcore.types import Step


@dataclass
class DetectorDeps:
    """What detectors may need from the server: judge backends by name, the default judge; the
    generator's client (the prompt detector asks it); for the probe and the cascade a probe (loaded, or
    the path of its file, which the probe's own `from_deps` reads) and a hidden-states client (both, or
    neither is built); the server's cascade thresholds and where the cascade reports its decisions.
    Services are typed loosely so that this layer imports no client it does not use."""

    judges: dict[str, Any] = field(default_factory=dict)
    default_judge: str | None = None
    generator: Any = None  # clients.vllm.VLLMClient
    probe: Any = None  # detectors.probe.Probe, already loaded (replay, tests)
    probe_path: str | None = None  # a probe file, read when the probe is built (settings.probe_path)
    hidden: Any = None  # clients.hidden_states.HiddenStatesClient
    cascade_low: float = 0.1
    cascade_high: float = 0.9
    cascade_rewrites: str = "judge"  # "cascade": a rewrite's candidate goes through the probe first, as drafts do
    judge_samples: dict[str, int] = field(default_factory=dict)  # self-consistency replies per judge name
    # the consistency detector's settings (samples, temperature, max_tokens, threshold, claims, calibration)
    consistency: dict[str, Any] = field(default_factory=dict)
    routed_routes: str = "count=judge,*=probe"  # the routed detector's default routes (settings.routed_routes)
    on_cascade_decision: Callable[[str, int], None] | None = None


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
    gives_verdicts: ClassVar[bool] = True
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
