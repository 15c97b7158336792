"""The routed detector: each claim kind to its detector, in order, with the batch rules of the judge.

Its routes against real vLLM and a judge, through a door, are in tests/integration/test_consistency_vllm.py.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from faithproxy.detectors.base import Detector, DetectorDeps
from faithproxy.detectors.claim_readers import ContentWords, claim_reader
from faithproxy.detectors.registry import build_detectors
from faithproxy.detectors.routed import RoutedDetector, parse_routes
from faithproxy.faithcore.context import CheckResult, RequestView, Usage
from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict


class Recording(Detector):
    """Says UNFAITHFUL to the sentences it is told to, FAITHFUL to the rest, and records its calls."""

    name: ClassVar[str] = "recording"

    def __init__(self, label: str, false: frozenset[str] = frozenset()) -> None:
        self.label = label
        self.false = false
        self.calls: list[tuple[list[str], list[str]]] = []  # (accepted texts, checked texts)
        self.validated = 0

    def validate_request(self, view: RequestView) -> None:
        self.validated += 1

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        self.calls.append(([s.text for s in view.accepted], [s.text for s in new_steps]))
        verdicts = [
            Verdict(Faithfulness.UNFAITHFUL if s.text in self.false else Faithfulness.FAITHFUL, self.label)
            for s in new_steps
        ]
        return CheckResult(tuple(verdicts), Usage(prompt_tokens=1, completion_tokens=2))


def steps(*texts: str) -> list[Step]:
    typed = []
    for i, text in enumerate(texts):
        kind = StepKind.REASONING if text.startswith("So") else StepKind.PERCEPTION
        typed.append(Step(i, text, text, kind=kind))
    return typed


def view(**options: object) -> RequestView:
    return RequestView("r", "m", [], "q", options=options)


COUNT, OTHER, COUNT2 = "There are 3 circles.", "There is a red square on the left.", "There are two squares."
REASON = "So the answer is B."


def routed(false: frozenset[str] = frozenset()) -> tuple[RoutedDetector, Recording, Recording]:
    judge, probe = Recording("judge", false), Recording("probe", false)
    detector = RoutedDetector({"judge": judge, "probe": probe}, ContentWords(), {"count": "judge", "*": "probe"})
    return detector, judge, probe


def test_routes_parse_or_are_refused() -> None:
    assert parse_routes("count=judge, *=probe") == {"count": "judge", "*": "probe"}
    assert parse_routes("count=judge;object_in_cell=consistency;*=probe")["object_in_cell"] == "consistency"
    for bad in ("count=judge", "count=judge,count=probe,*=probe", "*=routed", "*=none", "count:judge,*=probe", ""):
        assert parse_routes(bad) is None, bad


def test_the_words_reader_tells_counts_from_other_claims() -> None:
    words = ContentWords()
    assert [words.kind(t) for t in (COUNT, OTHER, COUNT2, REASON)] == ["count", "object", "count", None]
    assert words.kind("There is no blue circle.") == "count"  # "no" counts; "a" does not
    world = claim_reader("faithproxy.benchmarks.shapesworld.claims:WorldClaims")
    assert world.kind("There are 3 objects in the image.") == "count"
    assert world.kind("There is a small red square in the top left.") == "object_in_cell"


async def test_each_kind_goes_to_its_detector_in_order_with_context() -> None:
    detector, judge, probe = routed()
    result = await detector.check(view(), steps(COUNT, OTHER, REASON, OTHER, COUNT2))
    assert [v.faithfulness for v in result.verdicts] == [Faithfulness.FAITHFUL] * 5
    assert {v.detector for v in result.verdicts} == {"routed"}
    assert [v.reason for v in result.verdicts][:2] == ["routed:judge:verdict", "routed:probe:verdict"]
    # the reasoning step between two steps of the probe's route goes with them: one call, not two
    assert judge.calls == [([], [COUNT]), ([COUNT, OTHER, REASON, OTHER], [COUNT2])]
    assert probe.calls == [([COUNT], [OTHER, REASON, OTHER])]
    assert result.usage.as_dict()["completion_tokens"] == 6  # three calls' usage added


async def test_an_unfaithful_step_ends_the_batch() -> None:
    detector, judge, probe = routed(frozenset({OTHER}))
    result = await detector.check(view(), steps(COUNT, OTHER, COUNT2))
    assert [v.faithfulness for v in result.verdicts] == [
        Faithfulness.FAITHFUL,
        Faithfulness.UNFAITHFUL,
        Faithfulness.UNKNOWN,
    ]
    assert result.verdicts[2].reason == "routed:not_reached"
    assert len(judge.calls) == 1  # COUNT2 was not sent: it is read again after the correction


async def test_leading_reasoning_passes_unchecked() -> None:
    detector, judge, probe = routed()
    result = await detector.check(view(), steps(REASON, COUNT))
    assert result.verdicts[0].reason == "routed:pass" and judge.calls == [([REASON], [COUNT])]
    assert probe.calls == []


async def test_a_request_routes_its_own_way_and_is_validated() -> None:
    detector, judge, probe = routed()
    own = view(routes={"*": "judge"})
    detector.validate_request(own)
    assert (judge.validated, probe.validated) == (1, 0)  # only the detectors its routes name
    await detector.check(own, steps(COUNT, OTHER))
    assert judge.calls == [([], [COUNT, OTHER])] and probe.calls == []
    with pytest.raises(PolicyError, match="not built: consistency"):
        detector.validate_request(view(routes={"*": "consistency"}))


def test_built_only_when_every_default_route_is() -> None:
    assert "routed" not in build_detectors(DetectorDeps(judges={"a": object()}))  # no probe for `*`
    built = build_detectors(DetectorDeps(judges={"a": object()}, routed_routes="count=judge,*=prompt", generator=1))
    assert isinstance(built["routed"], RoutedDetector)
    assert set(built["routed"].detectors) == set(built) - {"routed", "none"}
    with pytest.raises(ValueError, match="not kind=detector pairs"):
        build_detectors(DetectorDeps(routed_routes="count=judge"))
