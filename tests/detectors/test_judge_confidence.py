"""The judge's confidence in a flag, read from token log-probabilities: from replies of the learned
ShapesWorld judge recorded on real vLLM (tests/detectors/vllm_logprobs/, stream and non-stream), through
the OpenAI-compatible backend (its own client, against a local server answering with a recorded body),
into the detector's verdict and the client's annotation."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from faithproxy.clients.judge_base import UserTurn, turn_text
from faithproxy.clients.judges import JudgeBackend, JudgeConfig, JudgeResult, OpenAICompatibleJudge
from faithproxy.clients.logprobs import TokenChoice, completion_tokens, stream_tokens
from faithproxy.detectors.judge import THRESHOLD_OPTION, JudgeDetector
from faithproxy.detectors.judge_confidence import flag_confidence, number_probability, verdict_probability
from faithproxy.detectors.judge_prompt import JUDGE_SYSTEM_PROMPT, parse_judge_reply
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.images import ImageRef
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict
from faithproxy.server.observe.summary import step_annotation, trace_steps
from faithproxy.testing import threaded_app

RECORDED = Path(__file__).parent / "vllm_logprobs"


def recorded(name: str) -> Any:
    return json.loads((RECORDED / f"{name}.json").read_text())


@pytest.mark.parametrize("label", ["unfaithful", "faithful"])
def test_stream_and_non_stream_give_the_same_tokens_and_confidence(label: str) -> None:
    whole = completion_tokens(recorded(label))
    streamed = stream_tokens(recorded(f"{label}_stream"))
    assert whole is not None and whole == streamed
    text = recorded(label)["choices"][0]["message"]["content"]
    assert "".join(t.token for t in whole).startswith(text)  # vLLM also lists the end-of-turn token
    assert flag_confidence(whole) == flag_confidence(streamed)


def test_a_sure_flag_and_a_hesitant_one_read_from_real_vllm_logprobs() -> None:
    # a truly unfaithful sentence: UNFAITHFUL at 0.68 against FAITHFUL, sentence 2 certain
    sure = completion_tokens(recorded("unfaithful"))
    assert sure is not None
    p_unf, p_f = math.exp(-0.39232), math.exp(-1.12888)
    assert verdict_probability(sure) == pytest.approx(p_unf / (p_unf + p_f), abs=2e-3)
    assert number_probability(sure) == pytest.approx(1.0, abs=1e-4)
    # a false flag on a faithful chain: the judge also hesitates between sentences 2 and 3
    false_flag = completion_tokens(recorded("faithful"))
    assert false_flag is not None
    assert verdict_probability(false_flag) == pytest.approx(0.790, abs=2e-3)
    assert number_probability(false_flag) == pytest.approx(math.exp(-0.16457), abs=1e-3)
    assert flag_confidence(false_flag) == pytest.approx(0.790 * math.exp(-0.16457), abs=2e-3)


def test_a_verdict_spelled_in_pieces_and_unknown_cases() -> None:
    pieces = (
        TokenChoice("[Faith", 0.0),
        TokenChoice("fulness]:", 0.0),
        TokenChoice(" UN", math.log(0.6), ((" UN", math.log(0.6)), (" FA", math.log(0.3)), (" maybe", math.log(0.1)))),
        TokenChoice("FAITHFUL", 0.0),
        TokenChoice("\n[First unfaithful sentence]: ", 0.0),
        TokenChoice("1", math.log(0.5), (("1", math.log(0.5)), ("2", math.log(0.5)))),
        TokenChoice("2", 0.0),
    )
    assert verdict_probability(pieces) == pytest.approx(0.6 / 0.9)
    assert number_probability(pieces) == pytest.approx(0.5)  # "12": both of its tokens count
    assert flag_confidence(None) is None and flag_confidence(()) is None
    assert flag_confidence((TokenChoice("no verdict here", 0.0),)) is None
    assert verdict_probability((TokenChoice("[Faithfulness]: ", 0.0), TokenChoice("maybe", 0.0))) is None


@dataclass
class RecordedJudge:
    """A local server answering every chat completion with `body`; `seen` keeps each request's JSON."""

    url: str = ""
    body: dict[str, Any] = field(default_factory=dict)
    seen: list[dict[str, Any]] = field(default_factory=list)

    def judge(self, **options: Any) -> OpenAICompatibleJudge:
        config = JudgeConfig(name="vllm", backend="openai", model="m", api_key="k", base_url=f"{self.url}/v1")
        return OpenAICompatibleJudge(config.model_copy(update=options))


@pytest.fixture
def recorded_judge() -> Iterator[RecordedJudge]:
    server = RecordedJudge()
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        server.seen.append(await request.json())
        return server.body

    with threaded_app(app) as url:
        server.url = url
        yield server


async def test_the_openai_backend_asks_for_logprobs_and_the_verdict_carries_the_confidence(
    recorded_judge: RecordedJudge,
) -> None:
    seen = recorded_judge.seen
    body = recorded_judge.body = recorded("unfaithful")
    judge = recorded_judge.judge()
    detector = JudgeDetector({"vllm": judge}, "vllm")
    texts = ["There are three objects.", "The square is red."]
    accepted = [Step(index=0, text=texts[0], raw=texts[0], kind=StepKind.PERCEPTION)]
    new = [Step(index=1, text=texts[1], raw=texts[1], kind=StepKind.PERCEPTION)]
    view = RequestView("r", "m", [], "How many?", (), accepted=tuple(accepted))
    try:
        verdicts = (await detector.check(view, new)).verdicts
    finally:
        await detector.aclose()
    assert seen[0]["logprobs"] is True and seen[0]["top_logprobs"] == 5
    assert parse_judge_reply(body["choices"][0]["message"]["content"], texts).first_unfaithful == 1
    (verdict,) = verdicts
    assert verdict.faithfulness is Faithfulness.UNFAITHFUL
    assert verdict.confidence == pytest.approx(flag_confidence(completion_tokens(body)))
    step = new[0]
    step.verdict = step.first_verdict = verdict
    assert step_annotation(step)["confidence"] == round(verdict.confidence or 0.0, 4)
    assert trace_steps([step])[0]["confidence"] == verdict.confidence


async def test_without_logprobs_the_confidence_is_unknown_and_visible(recorded_judge: RecordedJudge) -> None:
    seen = recorded_judge.seen
    body = recorded_judge.body = recorded("unfaithful")
    body["choices"][0]["logprobs"] = None  # a server that gives none (or a judge configured not to ask)
    judge = recorded_judge.judge()
    result = await judge.complete(JUDGE_SYSTEM_PROMPT, "x")
    await judge.aclose()
    assert result.tokens is None
    unsure_off = recorded_judge.judge(name="q", top_logprobs=None)
    await unsure_off.complete(JUDGE_SYSTEM_PROMPT, "x")
    await unsure_off.aclose()
    assert "logprobs" not in seen[-1] and "top_logprobs" not in seen[-1]
    texts = ["There are three objects.", "The square is red."]
    step = Step(index=1, text=texts[1], raw=texts[1], kind=StepKind.PERCEPTION)
    detector = JudgeDetector({"vllm": recorded_judge.judge()}, "vllm")
    accepted = (Step(index=0, text=texts[0], raw=texts[0], kind=StepKind.PERCEPTION),)
    (verdict,) = (await detector.check(RequestView("r", "m", [], "Q?", (), accepted=accepted), [step])).verdicts
    await detector.aclose()
    assert verdict.unfaithful and verdict.confidence is None
    step.verdict = step.first_verdict = verdict
    assert step_annotation(step)["confidence"] is None  # shown as null: the judge could not say


# ---- thresholds ----------------------------------------------------------------------------------


class LogprobJudge(JudgeBackend):
    """Replies in turn with (text, P(UNFAITHFUL) at the verdict or None: no log-probabilities)."""

    def __init__(self, replies: list[tuple[str, float | None]], flag_threshold: float | None = None) -> None:
        super().__init__(
            JudgeConfig(name="lp", backend="openai", model="m", api_key="k", flag_threshold=flag_threshold)  # type: ignore[arg-type]
        )
        self.replies = list(replies)
        self.turns: list[str] = []

    async def complete(self, system: str, user: UserTurn, images: Sequence[ImageRef] = ()) -> JudgeResult:
        self.turns.append(turn_text(user))
        text, p = self.replies.pop(0)
        return JudgeResult(text, 10, 5, 0.0, tokens=None if p is None else tokens_of(text, p))

    async def aclose(self) -> None:
        pass


def tokens_of(text: str, p_unfaithful: float) -> tuple[TokenChoice, ...]:
    """`text` as tokens, the verdict one token with both readings listed."""
    head, verdict, tail = re.split(r"(UNFAITHFUL|FAITHFUL)", text, maxsplit=1)
    top = (("UNFAITHFUL", math.log(p_unfaithful)), ("FAITHFUL", math.log(1 - p_unfaithful)))
    chosen = dict(top)[verdict]
    return (TokenChoice(head, 0.0), TokenChoice(verdict, chosen, top), TokenChoice(tail, 0.0))


def flag(k: int) -> str:
    return f"[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: {k}"


FAITHFUL_REPLY = "[Faithfulness]: FAITHFUL"
NEW = ["The square is red.", "The circle is blue.", "The circle is big."]


def new_steps() -> list[Step]:
    return [Step(index=i, text=t, raw=t, kind=StepKind.PERCEPTION) for i, t in enumerate(NEW)]


async def judged(judge: LogprobJudge, options: dict[str, Any] | None = None) -> list[tuple[str, float | None]]:
    view = RequestView("r", "m", [], "Q?", (), options=options or {})
    verdicts = (await JudgeDetector({"lp": judge}, "lp").check(view, new_steps())).verdicts
    return [(v.faithfulness.value, v.confidence) for v in verdicts]


async def test_a_flag_under_the_request_threshold_is_unsure_and_the_rest_is_read_again() -> None:
    judge = LogprobJudge([(flag(1), 0.6), (flag(3), 0.9)])
    assert await judged(judge, {THRESHOLD_OPTION: 0.8}) == [
        ("unsure", pytest.approx(0.6)),
        ("faithful", None),
        ("unfaithful", pytest.approx(0.9)),
    ]
    assert len(judge.turns) == 2 and "Check sentences 2 to 3. Sentence 1 is context only." in judge.turns[1]


async def test_the_judge_s_threshold_bounds_the_request_s_and_unknown_confidence_is_acted_on() -> None:
    # configured 0.7: a request asking for 0.5 still gets 0.7
    laxer = await judged(LogprobJudge([(flag(2), 0.65), (FAITHFUL_REPLY, 0.1)], 0.7), {THRESHOLD_OPTION: 0.5})
    assert laxer[1][0] == "unsure"
    # a request may be stricter than the judge's configuration
    stricter = await judged(LogprobJudge([(flag(2), 0.75), (FAITHFUL_REPLY, 0.1)], 0.7), {THRESHOLD_OPTION: 0.8})
    assert stricter[1][0] == "unsure"
    assert (await judged(LogprobJudge([(flag(2), 0.75)], 0.7)))[1] == ("unfaithful", pytest.approx(0.75))
    # without log-probabilities the confidence is unknown and the threshold does not apply
    assert (await judged(LogprobJudge([(flag(2), None)], 0.99)))[1] == ("unfaithful", None)


def test_the_threshold_header_is_declared_on_the_judge_and_parsed_as_a_probability() -> None:
    (option,) = [o for o in JudgeDetector.options if o.key == THRESHOLD_OPTION]
    assert option.header == "x-faithproxy-flag-threshold"
    assert option.parse("0.8") == 0.8 and option.parse("1.5") is None and option.parse("nan") is None


def test_an_unsure_step_is_counted_under_its_own_verdict_and_is_not_residual() -> None:
    from prometheus_client import CollectorRegistry

    from faithproxy.server.observe.metrics import Metrics
    from faithproxy.server.observe.step_metrics import count_step

    registry = CollectorRegistry()
    metrics = Metrics(registry, detectors=["judge"])
    metrics.preinit_model("m", ["judge"])
    labels = {"kind": "perception", "verdict": "unsure", "detector": "judge", "model": "m"}
    assert registry.get_sample_value("faithproxy_steps_total", labels) == 0.0  # pre-initialised
    step = new_steps()[0]
    step.verdict = step.first_verdict = Verdict(Faithfulness.UNSURE, "judge", kind=StepKind.PERCEPTION, confidence=0.6)
    count_step(metrics, step, "judge", "m")
    assert registry.get_sample_value("faithproxy_steps_total", labels) == 1.0
    assert step_annotation(step)["verdict"] == "unsure" and step_annotation(step)["confidence"] == 0.6
    assert not step_annotation(step)["residual"]


async def test_the_cascade_s_judge_stage_keeps_the_confidence_and_applies_the_threshold() -> None:
    from faithproxy.detectors.cascade import CascadeDetector
    from tests.detectors.test_cascade import FixedProbe

    judge = JudgeDetector({"lp": LogprobJudge([(flag(1), 0.6), (FAITHFUL_REPLY, 0.1)])}, "lp")
    cascade = CascadeDetector(FixedProbe(dict.fromkeys(NEW, 0.5)), judge)  # the probe is unsure of every step
    view = RequestView("r", "m", [], "Q?", (), options={THRESHOLD_OPTION: 0.8})
    verdicts = (await cascade.check(view, new_steps())).verdicts
    assert [(v.faithfulness.value, v.confidence, v.score) for v in verdicts] == [
        ("unsure", pytest.approx(0.6), 0.5),
        ("faithful", None, 0.5),
        ("faithful", None, 0.5),
    ]
    assert verdicts[0].reason == "cascade:judge:lp:unsure"
