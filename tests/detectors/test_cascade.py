"""Cascade routing: which steps the probe decides, which go to the judge, and what is counted."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, get_args

import pytest

from faithproxy.detectors.base import Detector
from faithproxy.detectors.cascade import REWRITE_CHECKERS, CascadeDetector
from faithproxy.detectors.probe import ProbeDetector, Scored
from faithproxy.faithcore.context import CheckResult, RequestView
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict
from faithproxy.server.settings import Settings

F, U, N = Faithfulness.FAITHFUL, Faithfulness.UNFAITHFUL, Faithfulness.UNKNOWN


class FixedProbe(ProbeDetector):
    """Scores by step text; reasoning steps get None, as the real probe gives them."""

    def __init__(self, scores: dict[str, float]) -> None:
        self.fixed = scores

    def validate_request(self, view: RequestView) -> None:
        return None

    async def scores(self, view: RequestView, new_steps: list[Step]) -> Scored:
        return Scored([None if s.kind is StepKind.REASONING else self.fixed[s.text] for s in new_steps], None)


class RecordingJudge(Detector):
    """Unfaithful for the texts in `bad` (then UNKNOWN after, as the judge does); records its calls."""

    name: ClassVar[str] = "judge"

    def __init__(self, bad: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.bad = bad
        self.calls: list[tuple[list[str], list[str]]] = []

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        self.calls.append(([s.text for s in view.accepted], [s.text for s in new_steps]))
        out, hit = [], False
        for s in new_steps:
            if hit:
                out.append(Verdict(N, "judge", reason="judge:x:not_reached"))
            elif s.text in self.bad:
                hit = True
                out.append(Verdict(U, "judge", kind=StepKind.PERCEPTION, reason="judge:x"))
            else:
                out.append(Verdict(F, "judge", kind=s.kind, reason="judge:x"))
        return CheckResult(tuple(out))


def steps(*texts: str) -> list[Step]:
    return [
        Step(index=i, text=t, raw=" " + t, kind=StepKind.REASONING if t.startswith("So") else StepKind.PERCEPTION)
        for i, t in enumerate(texts)
    ]


def ctx(accepted: list[Step] | None = None, **options: Any) -> RequestView:
    return RequestView(request_id="r", model="m", messages=[], question="q", images=(), accepted=accepted or (),
                       options=options)  # fmt: skip


def cascade(scores: dict[str, float], judge: RecordingJudge, **kw: Any) -> tuple[CascadeDetector, list[Any]]:
    seen: list[Any] = []
    detector = CascadeDetector(FixedProbe(scores), judge, on_decision=lambda stage, n: seen.append((stage, n)), **kw)
    return detector, seen


async def test_confident_probe_decides_without_judge() -> None:
    judge = RecordingJudge()
    detector, seen = cascade({"A.": 0.01, "B.": 0.02}, judge)
    verdicts = (await detector.check(ctx(), steps("A.", "So C.", "B."))).verdicts
    assert [v.faithfulness for v in verdicts] == [F, F, F]
    assert judge.calls == [] and seen == [("probe", 1), ("probe", 1)]
    assert all(v.detector == "cascade" for v in verdicts) and verdicts[0].reason == "cascade:probe"


async def test_confident_unfaithful_ends_the_batch() -> None:
    judge = RecordingJudge()
    detector, _ = cascade({"A.": 0.05, "B.": 0.97, "C.": 0.5}, judge)
    verdicts = (await detector.check(ctx(), steps("A.", "B.", "C."))).verdicts
    assert [v.faithfulness for v in verdicts] == [F, U, N]
    assert verdicts[1].score == 0.97 and judge.calls == []
    assert dict(detector.decisions) == {"probe": 2}


async def test_uncertain_step_goes_to_judge_with_earlier_steps_as_context() -> None:
    judge = RecordingJudge(bad={"C."})
    detector, seen = cascade({"A.": 0.05, "B.": 0.5, "C.": 0.01}, judge)
    earlier = steps("Z.")
    verdicts = (await detector.check(ctx(accepted=earlier), steps("A.", "B.", "C."))).verdicts
    # the judge gets B. and everything after it, with the accepted step and A. as context
    assert judge.calls == [(["Z.", "A."], ["B.", "C."])]
    assert [v.faithfulness for v in verdicts] == [F, F, U]
    assert verdicts[2].reason == "cascade:judge:x" and verdicts[2].score == 0.01
    assert seen == [("probe", 1), ("judge", 2)]


@pytest.mark.parametrize(("low", "high", "judged"), [(0.0, 1.0, True), (0.4, 0.6, False)])
async def test_thresholds_come_from_the_request(low: float, high: float, judged: bool) -> None:
    judge = RecordingJudge()
    detector, _ = cascade({"A.": 0.3}, judge, low=0.1, high=0.9)  # server defaults: A. is uncertain
    await detector.check(ctx(cascade_low=low, cascade_high=high), steps("A."))
    assert bool(judge.calls) is judged


def test_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        CascadeDetector(FixedProbe({}), RecordingJudge(), low=0.8, high=0.2)


@pytest.mark.parametrize("rewrites", ["cascade", "judge"])
async def test_a_rewrite_goes_to_the_judge_alone_when_configured(rewrites: str) -> None:
    # the probe is sure the candidate is faithful; only with rewrites="judge" does the judge see it
    judge = RecordingJudge(bad={"B."})
    detector, seen = cascade({"B.": 0.01}, judge, rewrites=rewrites)
    draft = (await detector.check(ctx(), steps("B."))).verdicts
    rewrite = (await detector.check(dataclasses.replace(ctx(), rewrite=True), steps("B."))).verdicts
    assert [v.faithfulness for v in draft] == [F]  # a draft step: the probe decides either way
    if rewrites == "judge":
        assert [v.faithfulness for v in rewrite] == [U] and judge.calls == [([], ["B."])]
        assert rewrite[0].detector == "cascade" and rewrite[0].reason == "cascade:judge:x" and rewrite[0].score is None
        assert seen == [("probe", 1), ("judge", 1)]
    else:
        assert [v.faithfulness for v in rewrite] == [F] and judge.calls == []


@pytest.mark.parametrize(("server", "header", "judged"), [("judge", "cascade", False), ("cascade", "judge", True)])
async def test_the_request_chooses_who_checks_its_rewrites(server: str, header: str, judged: bool) -> None:
    judge = RecordingJudge(bad={"B."})
    detector, _ = cascade({"B.": 0.01}, judge, rewrites=server)
    view = dataclasses.replace(ctx(cascade_rewrites=header), rewrite=True)
    verdicts = (await detector.check(view, steps("B."))).verdicts
    assert [v.faithfulness for v in verdicts] == [U if judged else F] and bool(judge.calls) is judged


def test_rewrites_are_checked_by_the_cascade_or_the_judge() -> None:
    with pytest.raises(ValueError, match="'cascade' or 'judge'"):
        CascadeDetector(FixedProbe({}), RecordingJudge(), rewrites="probe")


def test_the_settings_offer_exactly_the_cascades_rewrite_checkers() -> None:
    # server/settings.py spells the choices out (server/ reaches plug-ins only through the registry)
    assert set(get_args(Settings.model_fields["cascade_rewrites"].annotation)) == set(REWRITE_CHECKERS)
