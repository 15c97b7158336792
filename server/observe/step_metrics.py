"""Counting a step that left the correction machine: the metrics read what it decided, never decide."""

from __future__ import annotations

from collections.abc import Iterable

from faithproxy.faithcore.types import Faithfulness, Step, StepKind
from faithproxy.server.observe.metrics import Metrics


def count_step(m: Metrics, step: Step, detector: str, model: str) -> None:
    """Counts a step whose outcome the machine has settled."""
    detected = step.first_verdict.faithfulness if step.first_verdict else Faithfulness.UNKNOWN
    m.steps.labels(step.kind.value, detected.value, detector, model).inc()
    if step.attempts:
        outcome = "fixed" if step.original_text is not None else "failed"
        m.regeneration_outcomes.labels(outcome, str(step.attempts)).inc()
    if step.unchecked_reason == "gated":
        m.gated_steps.labels(detector, model).inc()
    if step.kind is not StepKind.PERCEPTION:
        return
    if detected is Faithfulness.UNKNOWN:
        m.unchecked.labels(detector, model, step.unchecked_reason or "detector_error").inc()
    if step.residual:
        m.residual.labels(detector, model, step.residual_reason or "unchecked").inc()


def perception_verdicts(steps: Iterable[Step]) -> list[str]:
    """The verdict each perception step's original text got (faithproxy_perception_steps_total's)."""
    return [
        (s.first_verdict.faithfulness if s.first_verdict else Faithfulness.UNKNOWN).value
        for s in steps
        if s.kind is StepKind.PERCEPTION
    ]
