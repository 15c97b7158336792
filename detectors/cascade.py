"""`cascade`: the probe decides when it is confident, the judge when it is not.

For each batch of new steps the probe scores every perception step first. A step with P(unfaithful)
below `low` is FAITHFUL by the probe, above `high` UNFAITHFUL by the probe; in between it is uncertain.
Going through the steps in order:
- a confident step is decided by the probe (an unfaithful one ends the batch: later steps are UNKNOWN,
  read again after the correction, as the judge does);
- at the first uncertain step the judge gets that step and every step after it in the batch (one call,
  the steps the probe passed before it as "checked before" context), and its verdicts are taken as they
  are. Reasoning steps before that point pass as FAITHFUL.

A rewrite's candidate (view.rewrite) goes to the judge alone (`rewrites="judge"`, the default;
FAITHPROXY_CASCADE_REWRITES, per request X-Faithproxy-Cascade-Rewrites), or with "cascade" through the
same stages as a draft. The probe learned from the model's own drafts, and a rewrite that passes its
check goes out as the model's step with nothing after it to catch it: on 100 validation chains, 69% of
the rewrites the cascade accepted were true by ground truth, 87% of those the judge accepted, and the
residual-UPR cut went from 46% to 64% for 4% more judge calls (docs/judge.md).

Thresholds come per request (view.options `cascade_low`, `cascade_high`, from the headers it declares),
else from the settings (DetectorDeps). The probe's features come back in the CheckResult.
`decisions` counts which stage decided each step; the server turns it into
faithproxy_cascade_decisions_total{stage}.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from faithproxy.detectors.base import Detector
from faithproxy.detectors.judge import JudgeDetector
from faithproxy.detectors.options import DetectorOption, probability
from faithproxy.detectors.probe import ProbeDetector
from faithproxy.faithcore.context import CheckResult, RequestView
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict

if TYPE_CHECKING:
    from faithproxy.detectors.base import DetectorDeps

# The stages that decide a step: the label set of faithproxy_cascade_decisions_total{stage}.
STAGES = ("probe", "judge")
LOW_OPTION, HIGH_OPTION, REWRITES_OPTION = "cascade_low", "cascade_high", "cascade_rewrites"  # RequestView.options keys
_PROBABILITY = "a probability from 0 to 1"
REWRITE_CHECKERS = ("judge", "cascade")  # who checks a rewrite's candidate


def rewrite_checker(raw: str) -> str | None:
    value = raw.strip().lower()
    return value if value in REWRITE_CHECKERS else None


class CascadeDetector(Detector):
    """Probe first, judge for the steps the probe is unsure about."""

    name: ClassVar[str] = "cascade"
    description: ClassVar[str] = "probe when confident, judge otherwise"
    reads_hidden_states: ClassVar[bool] = True
    uses_judge: ClassVar[bool] = True
    options: ClassVar[tuple[DetectorOption, ...]] = (
        DetectorOption(
            LOW_OPTION,
            "x-faithproxy-cascade-low",
            probability,
            _PROBABILITY,
            setting="cascade_low",
            not_above=HIGH_OPTION,
        ),
        DetectorOption(HIGH_OPTION, "x-faithproxy-cascade-high", probability, _PROBABILITY, setting="cascade_high"),
        DetectorOption(
            REWRITES_OPTION,
            "x-faithproxy-cascade-rewrites",
            rewrite_checker,
            "judge or cascade",
            setting="cascade_rewrites",
        ),
    )
    decision_stages: ClassVar[tuple[str, ...]] = STAGES

    def __init__(
        self,
        probe: ProbeDetector,
        judge: Detector,
        *,
        low: float = 0.1,
        high: float = 0.9,
        on_decision: Callable[[str, int], None] | None = None,
        rewrites: str = "judge",
    ) -> None:
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"cascade thresholds must satisfy 0 <= low <= high <= 1 (got {low}, {high})")
        if rewrites not in REWRITE_CHECKERS:
            raise ValueError(f"cascade rewrites must be checked by 'cascade' or 'judge' (got {rewrites!r})")
        self.rewrites = rewrites
        self.probe = probe
        self.judge = judge
        self.low = low
        self.high = high
        self.on_decision = on_decision  # (stage, steps) → e.g. a Prometheus counter
        self.decisions: Counter[str] = Counter()

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> CascadeDetector | None:
        """Made of the probe and the judge built before it; None unless both were."""
        probe = next((d for d in built.values() if isinstance(d, ProbeDetector)), None)
        judge = next((d for d in built.values() if isinstance(d, JudgeDetector)), None)
        if probe is None or judge is None:
            return None
        return cls(
            probe,
            judge,
            low=deps.cascade_low,
            high=deps.cascade_high,
            on_decision=deps.on_cascade_decision,
            rewrites=deps.cascade_rewrites,
        )

    def validate_request(self, view: RequestView) -> None:
        self.probe.validate_request(view)

    def thresholds(self, view: RequestView) -> tuple[float, float]:
        low = view.options.get(LOW_OPTION, self.low)
        high = view.options.get(HIGH_OPTION, self.high)
        return float(low), float(high)

    def _count(self, stage: str, steps: int) -> None:
        if steps:
            self.decisions[stage] += steps
            if self.on_decision is not None:
                self.on_decision(stage, steps)

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        if not new_steps:
            return CheckResult(())
        started = time.perf_counter()
        if view.rewrite and view.options.get(REWRITES_OPTION, self.rewrites) == "judge":
            return await self._judged(view, new_steps, [None] * len(new_steps), None, started)
        low, high = self.thresholds(view)
        scores, features = await self.probe.scores(view, new_steps)
        latency = time.perf_counter() - started
        verdicts: list[Verdict] = []
        for i, (step, score) in enumerate(zip(new_steps, scores, strict=True)):
            if score is None:  # a reasoning step: nothing for the probe to decide
                verdicts.append(Verdict(Faithfulness.FAITHFUL, self.name, kind=step.kind, latency_s=latency))
                continue
            if score < low or score > high:
                unfaithful = score > high
                verdicts.append(
                    Verdict(
                        Faithfulness.UNFAITHFUL if unfaithful else Faithfulness.FAITHFUL,
                        self.name,
                        kind=step.kind,
                        reason="cascade:probe",
                        latency_s=latency,
                        score=score,
                    )
                )
                self._count("probe", 1)
                if unfaithful:
                    rest = new_steps[i + 1 :]
                    verdicts += [
                        Verdict(Faithfulness.UNKNOWN, self.name, reason="cascade:probe:not_reached") for _ in rest
                    ]
                    return CheckResult(tuple(verdicts), features=features)
                continue
            # uncertain: the judge decides from here on, with the steps passed so far as context
            view = view.with_accepted([*view.accepted, *new_steps[:i]])
            judged = await self._judged(view, new_steps[i:], scores[i:], features, started)
            return dataclasses.replace(judged, verdicts=(*verdicts, *judged.verdicts))
        return CheckResult(tuple(verdicts), features=features)

    async def _judged(
        self,
        view: RequestView,
        steps: list[Step],
        scores: list[float | None],
        features: Any,  # the probe's, for the whole batch (None: it was not asked)
        started: float,
    ) -> CheckResult:
        """The judge's verdicts on `steps`, named for the cascade, with the probe's score beside each."""
        result = await self.judge.check(view, steps)
        kinds = [v.kind or s.kind for s, v in zip(steps, result.verdicts, strict=True)]
        self._count("judge", sum(1 for kind in kinds if kind is StepKind.PERCEPTION))
        elapsed = time.perf_counter() - started
        verdicts = [
            dataclasses.replace(
                verdict, detector=self.name, reason=f"cascade:{verdict.reason or 'judge'}", latency_s=elapsed, score=p
            )
            for verdict, p in zip(result.verdicts, scores, strict=True)
        ]
        return CheckResult(tuple(verdicts), result.usage, features)
