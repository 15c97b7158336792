"""The consistency detector's parts that need no vLLM: claim readers, calibration, settings, votes.

Its sampling against real vLLM, on every door, is tests/integration/test_consistency_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from faithproxy.clients.vllm import VLLMClient
from faithproxy.detectors.claim_readers import ClaimReader, ContentWords, claim_reader
from faithproxy.detectors.consistency import Calibration, ConsistencyDetector
from faithproxy.detectors.registry import build_detectors, resolve
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.errors import DetectorError
from faithproxy.faithcore.registry import UnknownName
from faithproxy.faithcore.types import Faithfulness, Step, StepKind
from faithproxy.server.settings import Settings


def test_words_compare_claims_not_spellings() -> None:
    words = ContentWords()
    assert words.key("There are three circles in the image.") == words.key("There are 3 circles.")
    assert words.key("There is a red circle.") != words.key("There is a blue circle.")
    assert words.key("So the answer is B.") is None  # reasoning makes no claim


def test_readers_by_name_or_by_class_path() -> None:
    assert isinstance(claim_reader("words"), ContentWords)
    world = claim_reader("faithproxy.benchmarks.shapesworld.claims:WorldClaims")
    assert world.key("There are three objects in the image.") == world.key("There are 3 objects in the image.")
    with pytest.raises(UnknownName, match="did you mean 'words'"):
        claim_reader("word")
    with pytest.raises(UnknownName):
        claim_reader("faithproxy.detectors.claim_readers:Missing")
    with pytest.raises(TypeError, match="not a ClaimReader"):
        claim_reader("faithproxy.detectors.claim_readers:claim_reader")


def test_calibration_maps_the_share_monotonically(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"a": 6.0, "b": -3.0}))
    calibration = Calibration.load(path)
    assert calibration(0.5) == pytest.approx(0.5)
    assert calibration(0.0) < calibration(0.25) < calibration(1.0)


def test_settings_reach_the_detector(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"a": 1.0, "b": 0.0}))
    settings = Settings(consistency_samples=5, consistency_threshold=0.3, consistency_calibration=str(path))
    assert settings.consistency_claims == "words"
    from faithproxy.detectors.base import DetectorDeps

    deps = DetectorDeps(
        generator=object(),
        consistency={"samples": 5, "threshold": 0.3, "claims": "words", "calibration": str(path)},
    )
    detector = build_detectors(deps)["consistency"]
    assert isinstance(detector, ConsistencyDetector)
    assert detector.samples == 5 and detector.threshold == 0.3 and detector.calibration == Calibration(1.0, 0.0)
    assert resolve("consistency").uses_judge is False
    with pytest.raises(ValueError):
        Settings(consistency_samples=1)


class _Words(ClaimReader):
    name = "test"

    def key(self, sentence: str) -> str | None:
        return sentence.strip(" .").lower() or None


def _detector(choices: list[str], seen: list[dict]) -> ConsistencyDetector:
    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        body = {"choices": [{"index": i, "message": {"content": c}} for i, c in enumerate(choices)],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3 * len(choices)}}  # fmt: skip
        return httpx.Response(200, json=body)

    client = VLLMClient("http://vllm.test", transport=httpx.MockTransport(reply))
    return ConsistencyDetector(client, _Words(), samples=len(choices), threshold=0.5)


def _view() -> RequestView:
    return RequestView("r", "m", [{"role": "user", "content": "q"}], "q")


async def test_votes_over_samples_that_make_a_claim() -> None:
    seen: list[dict] = []
    # two samples repeat the step, one says otherwise, one makes no claim (no vote)
    detector = _detector([" A red circle. So B.", " A blue circle.", " A red circle.", " "], seen)
    step = Step(index=1, text="A red circle.", raw=" A red circle.", kind=StepKind.PERCEPTION)
    accepted = Step(index=0, text="One shape.", raw="<think>\nOne shape.", kind=StepKind.PERCEPTION)
    result = await detector.check(_view().with_accepted([accepted]), [step])
    (verdict,) = result.verdicts
    assert verdict.faithfulness is Faithfulness.FAITHFUL and verdict.reason == "2 of 3 samples agree"
    assert verdict.score == pytest.approx(1 / 3, abs=1e-4)
    (body,) = seen
    assert body["n"] == 4 and body["continue_final_message"] is True and body["seed"] == 1  # the step's index
    assert body["messages"][-1] == {"role": "assistant", "content": "<think>\nOne shape."}
    assert result.usage.completion_tokens == 12


async def test_a_step_most_samples_contradict_is_flagged_and_reasoning_passes() -> None:
    detector = _detector([" A blue circle.", " A blue circle.", " A red circle."], [])
    perception = Step(index=0, text="A red circle.", raw="A red circle.", kind=StepKind.PERCEPTION)
    reasoning = Step(index=1, text="So the answer is B.", raw=" So the answer is B.", kind=StepKind.REASONING)
    result = await detector.check(_view(), [perception, reasoning])
    assert [v.faithfulness for v in result.verdicts] == [Faithfulness.UNFAITHFUL, Faithfulness.FAITHFUL]


async def test_no_votes_is_unknown_and_a_failed_call_is_a_detector_error() -> None:
    silent = _detector([" ", " "], [])
    step = Step(index=0, text="A red circle.", raw="A red circle.", kind=StepKind.PERCEPTION)
    (verdict,) = (await silent.check(_view(), [step])).verdicts
    assert verdict.faithfulness is Faithfulness.UNKNOWN and verdict.unchecked == "no_votes"

    client = VLLMClient("http://vllm.test", transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    broken = ConsistencyDetector(client, _Words(), samples=2)
    with pytest.raises(DetectorError, match="consistency sampling failed"):
        await broken.check(_view(), [step])


async def test_a_rewrite_passes_when_no_other_alternative_has_more_samples() -> None:
    seen: list[dict] = []
    samples = [
        " A red circle.",
        " A blue circle.",
        " A red circle.",
        " A blue circle.",
        " A red circle.",
        " A green one.",
    ]
    detector = _detector(samples, seen)
    detector.threshold = 0.3
    draft = Step(index=0, text="A red circle.", raw="A red circle.", kind=StepKind.PERCEPTION)
    (flag,) = (await detector.check(_view(), [draft])).verdicts
    assert flag.faithfulness is Faithfulness.UNFAITHFUL  # 3 of 6 against

    rewrite_view = RequestView("r", "m", [{"role": "user", "content": "q"}], "q", rewrite=True)
    blue = Step(index=0, text="A blue circle.", raw="A blue circle.", kind=StepKind.PERCEPTION)
    green = Step(index=0, text="A green one.", raw="A green one.", kind=StepKind.PERCEPTION)
    (ok,) = (await detector.check(rewrite_view, [blue])).verdicts
    (weak,) = (await detector.check(rewrite_view, [green])).verdicts
    assert ok.faithfulness is Faithfulness.FAITHFUL and "best alternative 1" in (ok.reason or "")
    assert weak.faithfulness is Faithfulness.UNFAITHFUL  # blue has 2 samples behind it, green 1
    assert len(seen) == 1  # the rewrites were read against the draft's samples


async def test_resample_rewrites_with_the_most_sampled_other_claim() -> None:
    from faithproxy.regenerators.resample import ResampleRegenerator

    seen: list[dict] = []
    samples = [" A red circle.", " A blue circle. X.", " A green one.", " A blue circle.", " ", " A red circle."]

    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(
            200, json={"choices": [{"index": i, "message": {"content": c}} for i, c in enumerate(samples)]}
        )

    client = VLLMClient("http://vllm.test", transport=httpx.MockTransport(reply))
    regenerator = ResampleRegenerator(client, samples=6, claims=_Words())
    bad = Step(index=0, text="A red circle.", raw="A red circle.", kind=StepKind.PERCEPTION)
    out = await regenerator.regenerate(_view(), [], bad, 1)
    assert out.candidate == "A blue circle."  # red is the flagged claim; blue has 2 samples, green 1
    bad.rejected.append("A blue circle.")
    assert (await regenerator.regenerate(_view(), [], bad, 2)).candidate == "A green one."
    assert seen[0]["n"] == 6 and seen[0]["temperature"] == 1.0 and seen[0]["continue_final_message"] is True
