"""Self-consistency as a judge's confidence (judges without log-probabilities): the real anthropic SDK
backend against a local stub of the Messages API whose replies are scripted, since there is no
Anthropic API here. A flag is asked n times in all; the share naming the same sentence is its
confidence, the threshold applies to it, and every call is billed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI, Request

from faithproxy.clients.judges import build_judge
from faithproxy.detectors.judge import JudgeDetector
from faithproxy.detectors.registry import DetectorDeps
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.types import Faithfulness, Step, StepKind
from faithproxy.testing import running_app
from tests.support import local_judge_config

SENTENCES = ("A man stands next to a bicycle.", "The man wears a red scarf.", "The basket is empty.")


def reply(first: int | None) -> str:
    lines = [f"Sentence {i}: PERCEPTION" for i in range(1, len(SENTENCES) + 1)]
    verdict = (
        ["[Faithfulness]: FAITHFUL"]
        if first is None
        else ["[Faithfulness]: UNFAITHFUL", f"[First unfaithful sentence]: {first}"]
    )
    return "\n".join(["[Image description]: A man and a bicycle.", *lines, *verdict])


class Script:
    """Replies in order (the last one repeats), and the calls received."""

    def __init__(self, *firsts: int | None) -> None:
        self.firsts = list(firsts)
        self.calls = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/messages")
        async def messages(request: Request) -> dict[str, Any]:
            await request.json()
            first = self.firsts[min(self.calls, len(self.firsts) - 1)]
            self.calls += 1
            return {
                "id": f"msg_{self.calls}", "type": "message", "role": "assistant", "model": "judge-model",
                "content": [{"type": "text", "text": reply(first)}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 100, "output_tokens": 20},
            }  # fmt: skip

        return app


@pytest.fixture
async def judged() -> AsyncIterator[Any]:
    async def run(script: Script, samples: int | None, threshold: float | None = None) -> list[Any]:
        async with running_app(script.app()) as url:
            judge = build_judge(local_judge_config("anthropic", url, temperature=1.0))
            detector = JudgeDetector(
                {judge.name: judge}, judge.name, samples={judge.name: samples} if samples else None
            )
            options = {"flag_threshold": threshold} if threshold is not None else {}
            view = RequestView("r", "m", [], "What does the man wear?", options=options)
            steps = [Step(index=i, text=t, raw=t, kind=StepKind.PERCEPTION) for i, t in enumerate(SENTENCES)]
            try:
                result = await detector.check(view, steps)
            finally:
                await detector.aclose()
            return [result.verdicts, view.judge_state.summary(), detector.calls]

    yield run


async def test_the_share_of_replies_naming_the_same_sentence_is_the_confidence(judged: Any) -> None:
    script = Script(2, 2, 3, None, 2)  # the first reply and 2 of the 4 more name sentence 2
    verdicts, bill, calls = await judged(script, samples=5)
    assert verdicts[1].faithfulness is Faithfulness.UNFAITHFUL and verdicts[1].confidence == pytest.approx(3 / 5)
    assert script.calls == 5 and calls == 5 and bill["calls"] == 5 and bill["output_tokens"] == 100


async def test_under_the_threshold_the_flag_is_unsure_and_the_rest_is_asked_again(judged: Any) -> None:
    script = Script(2, 3, 3, None)  # 1 of 4 name sentence 2; asked again about sentence 3: "None" from then on
    verdicts, _, _ = await judged(script, samples=4, threshold=0.5)
    assert [v.faithfulness for v in verdicts] == [Faithfulness.FAITHFUL, Faithfulness.UNSURE, Faithfulness.FAITHFUL]
    assert verdicts[1].confidence == pytest.approx(1 / 4) and verdicts[1].reason.endswith(":unsure")


async def test_without_samples_the_confidence_is_unknown_and_no_threshold_applies(judged: Any) -> None:
    script = Script(2, 3)
    verdicts, _, calls = await judged(script, samples=None, threshold=0.9)
    assert verdicts[1].faithfulness is Faithfulness.UNFAITHFUL and verdicts[1].confidence is None
    assert script.calls == 1 and calls == 1


async def test_a_faithful_reply_costs_one_call_whatever_the_samples(judged: Any) -> None:
    script = Script(None)
    verdicts, _, _ = await judged(script, samples=5)
    assert all(v.faithfulness is Faithfulness.FAITHFUL for v in verdicts) and script.calls == 1


def test_samples_must_name_a_configured_judge_and_be_at_least_two() -> None:
    judge = build_judge(local_judge_config("anthropic", "http://127.0.0.1:9"))
    for bad in ({"other": 3}, {judge.name: 1}):
        with pytest.raises(ValueError, match="judge samples"):
            JudgeDetector({judge.name: judge}, judge.name, samples=bad)
    built = JudgeDetector.from_deps(DetectorDeps(judges={judge.name: judge}, judge_samples={judge.name: 3}), {})
    assert built is not None and built.samples == {judge.name: 3}
