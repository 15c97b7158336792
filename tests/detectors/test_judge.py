"""JudgeDetector end to end: real SDK backends, a real uvicorn judge server with an oracle."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from faithproxy.benchmarks.standins.judge_server import JudgeServerState, create_app, running_judge_server
from faithproxy.benchmarks.standins.prompt_cache import VLLM_BLOCK
from faithproxy.clients.judge_base import UserTurn
from faithproxy.clients.judges import JudgeBackend, JudgeConfig, JudgeResult, build_judge
from faithproxy.detectors.judge import DescriptionCache, JudgeDetector
from faithproxy.detectors.none import NoneDetector
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.errors import DetectorError
from faithproxy.faithcore.images import ImageRef, parse_image_url
from faithproxy.faithcore.types import Faithfulness, Step, StepKind
from tests.support import local_judge_config

PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
IMAGE = parse_image_url(f"data:image/png;base64,{PNG_1PX}")
OTHER_IMAGE = parse_image_url("https://example.com/other.png")
ORACLE = {
    "unfaithful": ["The man wears a red scarf.", "The basket is empty."],
    "reasoning": ["He might be cold."],
    "description": "A man in a red hat next to a bicycle.",
}
F, U, N = Faithfulness.FAITHFUL, Faithfulness.UNFAITHFUL, Faithfulness.UNKNOWN
P, R = StepKind.PERCEPTION, StepKind.REASONING


# A call expected to be answered gets a limit no loaded machine reaches (it bounds a hang, it measures
# nothing); only a call the server never answers ("hang") runs into HANG_TIMEOUT_S.
ANSWERED_TIMEOUT_S = 30.0
HANG_TIMEOUT_S = 0.5


@dataclass
class Env:
    detector: JudgeDetector
    state: JudgeServerState
    judge_name: str
    backend: str
    url: str


@pytest.fixture(params=["anthropic", "openai"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    app = create_app(ORACLE)
    async with running_judge_server(app) as url:
        backend = request.param
        judge = build_judge(local_judge_config(backend, url, timeout_s=ANSWERED_TIMEOUT_S))
        detector = JudgeDetector({judge.name: judge}, judge.name)
        yield Env(detector, app.state.judge, judge.name, backend, url)
        await detector.aclose()


def steps(*texts: str, start: int = 0, kind: StepKind = P) -> list[Step]:
    return [Step(index=start + i, text=t, raw=t, kind=kind) for i, t in enumerate(texts)]


def context(
    accepted: list[Step] | None = None, images: list[ImageRef] | None = None, options: dict[str, Any] | None = None
) -> RequestView:
    return RequestView(
        request_id="req-1",
        model="generator",
        messages=[],
        question="What does the man wear?",
        images=(IMAGE,) if images is None else tuple(images),
        accepted=accepted or (),
        options=options or {},
    )


async def test_batch_of_new_steps_is_one_call_with_mapped_verdicts(env: Env) -> None:
    new = steps(
        "A man stands next to a bicycle.",
        "So he is going for a ride.",  # typed REASONING by the judge; the step itself says PERCEPTION
        "The man wears a red scarf.",
        "The bicycle is blue.",
    )
    verdicts = (await env.detector.check(context(), new)).verdicts
    assert [v.faithfulness for v in verdicts] == [F, F, U, N]
    assert [v.kind for v in verdicts] == [P, R, P, P]
    assert env.state.requests == 1 and env.state.sentences_judged == 4
    assert {v.latency_s for v in verdicts} == {verdicts[0].latency_s} and verdicts[0].latency_s > 0
    assert all(v.detector == "judge" for v in verdicts)
    assert [v.reason for v in verdicts] == [f"judge:{env.judge_name}"] * 3 + [f"judge:{env.judge_name}:not_reached"]


async def test_all_faithful(env: Env) -> None:
    new = steps("A man stands next to a bicycle.", "He might be cold.")
    verdicts = (await env.detector.check(context(), new)).verdicts
    assert [(v.faithfulness, v.kind) for v in verdicts] == [(F, P), (F, R)]


async def test_accepted_steps_are_context_only(env: Env) -> None:
    accepted = steps("A man stands next to a bicycle.", "The bicycle has a basket.")
    new = steps("The basket is empty.", "He might be cold.", start=2)
    verdicts = (await env.detector.check(context(accepted), new)).verdicts
    assert [v.faithfulness for v in verdicts] == [U, N]
    last = env.state.last_request
    assert last is not None and last["sentences"] == 4 and last["already_checked"] == 2
    assert env.state.sentences_judged == 2


async def test_a_residual_accepted_step_does_not_blind_the_judge(env: Env) -> None:
    """An unfaithful step that exhausted its retries stays in the chain; later steps are still judged."""
    accepted = steps("The man wears a red scarf.")
    verdicts = (await env.detector.check(context(accepted), steps("The bicycle is blue.", start=1))).verdicts
    assert [v.faithfulness for v in verdicts] == [F]
    assert env.state.requests == 1


async def test_judge_that_names_an_accepted_step_is_asked_about_new_steps_alone(env: Env) -> None:
    env.state.obey_checked = False
    accepted = steps("The man wears a red scarf.", "The bicycle is blue.")
    new = steps("A man stands next to a bicycle.", "The basket is empty.", "He might be cold.", start=2)
    verdicts = (await env.detector.check(context(accepted), new)).verdicts
    assert [v.faithfulness for v in verdicts] == [F, U, N]
    assert env.state.requests == 2
    assert env.state.last_request is not None and env.state.last_request["sentences"] == 3


async def test_no_new_steps_no_call(env: Env) -> None:
    assert (await env.detector.check(context(), [])).verdicts == ()
    assert env.state.requests == 0


async def test_the_image_is_described_once_per_request_and_then_part_of_every_prompt(env: Env) -> None:
    ctx = context()
    await env.detector.check(ctx, steps("A man stands next to a bicycle."))
    last = env.state.last_request
    assert last is not None and last["asks_description"] and last["description"] is None
    assert ctx.judge_state.description == ORACLE["description"] and ctx.judge_state.descriptions == 1
    ctx = ctx.with_accepted(steps("A man stands next to a bicycle."))
    await env.detector.check(ctx, steps("The bicycle is blue.", start=1))
    assert env.state.last_request["description"] == ORACLE["description"]
    assert not env.state.last_request["asks_description"]
    assert ctx.judge_state.descriptions == 1 and env.state.descriptions == 1


async def test_a_later_request_about_the_same_image_starts_with_its_description(env: Env) -> None:
    await env.detector.check(context(), steps("A man stands next to a bicycle."))
    again = context()
    await env.detector.check(again, steps("The bicycle is blue."))
    assert env.state.last_request is not None and env.state.last_request["description"] == ORACLE["description"]
    assert again.judge_state.descriptions == 0 and env.state.descriptions == 1  # nothing asked, nothing written
    await env.detector.check(context(images=[OTHER_IMAGE]), steps("The bicycle is blue."))
    assert env.state.last_request["asks_description"]  # another image, another description
    assert env.state.last_request["description"] is None
    await env.detector.check(context(images=[]), steps("The bicycle is blue."))
    assert not env.state.last_request["asks_description"]  # nothing to describe without an image
    assert env.state.last_request["description"] is None


async def test_the_judge_is_asked_about_new_sentences_only_and_its_bill_stays_flat(env: Env) -> None:
    """A 40-step chain, one new step per call: the reply types one sentence, so its output tokens are
    the same on every call but the first (which holds the description); the prompt grows, but the part the cache
    does not serve does not (both wire protocols, each with its own caching)."""
    ctx = context()
    bills = []
    for i in range(40):
        text = f"Step {i}: the bicycle has {i} spokes on its front wheel."
        await env.detector.check(ctx, steps(text, start=i))
        ctx = ctx.with_accepted([*ctx.accepted, steps(text, start=i)[0]])
        last = env.state.last_request
        assert last is not None and (last["sentences"], last["already_checked"]) == (i + 1, i)
        bills.append(last["usage"])
    outputs = [b["output_tokens"] for b in bills[1:]]
    assert max(outputs) - min(outputs) <= 1  # "Sentence 9" to "Sentence 10": one character more
    assert max(outputs) <= 15 < bills[0]["output_tokens"]
    fresh = [b["input_tokens"] + b["created"] for b in bills[2:]]
    # a sentence's worth of difference, not the chain's; vLLM's cache serves whole blocks only
    block = VLLM_BLOCK if env.state.last_request["protocol"] == "openai" else 0
    assert max(fresh) - min(fresh) <= 4 + block
    assert bills[-1]["cached"] > bills[2]["cached"]  # the accepted chain is served from cache
    usage = ctx.judge_state.usage
    assert usage.calls == 40 == env.state.requests
    assert usage.input_tokens + usage.cache_creation_tokens == sum(b["input_tokens"] + b["created"] for b in bills)
    assert usage.cached_input_tokens == sum(b["cached"] for b in bills)
    assert usage.output_tokens == sum(b["output_tokens"] for b in bills)
    assert env.detector.usage.calls == 40 and env.detector.calls == 40


async def test_anthropic_calls_mark_cache_breakpoints(env: Env) -> None:
    ctx = context(accepted=steps("A man stands next to a bicycle."))
    await env.detector.check(ctx, steps("The bicycle is blue.", start=1))
    last = env.state.last_request
    assert last is not None
    # question, end of the accepted chain, end of the chain; the OpenAI protocol marks nothing
    assert last["cache_control"] == (3 if last["protocol"] == "anthropic" else 0)


async def test_every_call_is_reported_as_it_returns(env: Env) -> None:
    seen: list[tuple[str, int, int]] = []
    ctx = context()
    ctx.judge_state.on_call = lambda judge, call: seen.append((judge, call.calls, call.output_tokens))
    await env.detector.check(ctx, steps("A man stands next to a bicycle."))
    await env.detector.check(ctx, steps("The bicycle is blue."))
    assert [(j, n) for j, n, _ in seen] == [(env.judge_name, 1)] * 2
    assert sum(out for _, _, out in seen) == ctx.judge_state.usage.output_tokens > 0


async def test_past_the_budget_steps_pass_unchecked_without_a_call(env: Env) -> None:
    ctx = context(options={"judge_budget_tokens": 1})  # spent by the first call, whatever it costs
    first = (await env.detector.check(ctx, steps("The man wears a red scarf."))).verdicts
    assert [v.faithfulness for v in first] == [U] and env.state.requests == 1
    later = steps("The basket is empty.", "He might be cold.", start=1, kind=P)
    verdicts = (await env.detector.check(ctx, later)).verdicts
    assert env.state.requests == 1  # no call past the budget
    assert [(v.faithfulness, v.unchecked) for v in verdicts] == [(N, "budget")] * 2
    assert verdicts[0].reason == f"judge:{env.judge_name}:budget" and verdicts[0].kind is P
    assert ctx.judge_state.budget_steps == 2
    none_at_all = context(options={"judge_budget_tokens": 0})
    passed = (await env.detector.check(none_at_all, steps("a", "b", kind=R))).verdicts
    assert [v.unchecked for v in passed] == ["budget"] * 2
    assert env.state.requests == 1 and none_at_all.judge_state.budget_steps == 0  # reasoning steps: not counted


async def test_cache_reads_do_not_count_against_the_budget(env: Env) -> None:
    ctx = context()
    for i in range(6):
        await env.detector.check(ctx, steps(f"The bicycle has {i} bells.", start=i))
        ctx = ctx.with_accepted([*ctx.accepted, *steps(f"The bicycle has {i} bells.", start=i)])
    usage = ctx.judge_state.usage
    assert usage.budget_tokens == usage.input_tokens + usage.cache_creation_tokens + usage.output_tokens
    assert usage.cached_input_tokens > 0 and usage.budget_tokens < usage.prompt_tokens + usage.output_tokens


@pytest.mark.parametrize(
    ("mode", "code"),
    [("500", "status_5xx"), ("429", "status_429"), ("garbage", "unparseable"), ("hang", "timeout")],
)
async def test_judge_failures_are_detector_errors(env: Env, mode: str, code: str) -> None:
    env.state.mode = mode  # type: ignore[assignment]
    detector = env.detector
    if mode == "hang":  # the one call that must run into its limit: a short one, so the test stays short
        judge = build_judge(local_judge_config(env.backend, env.url, timeout_s=HANG_TIMEOUT_S))
        detector = JudgeDetector({judge.name: judge}, judge.name)
    try:
        with pytest.raises(DetectorError) as info:
            await detector.check(context(), steps("The man wears a red scarf."))
    finally:
        if detector is not env.detector:
            await detector.aclose()
    assert info.value.code == code


async def test_request_picks_a_judge_by_name(env: Env) -> None:
    ctx = replace(context(), judge=env.judge_name)
    assert len((await env.detector.check(ctx, steps("The bicycle is blue."))).verdicts) == 1
    ctx = replace(ctx, judge="no-such-judge")
    with pytest.raises(DetectorError) as info:
        await env.detector.check(ctx, steps("The bicycle is blue."))
    assert info.value.code == "unknown_judge"


def test_default_judge_must_exist() -> None:
    with pytest.raises(ValueError, match="default judge"):
        JudgeDetector({}, "claude")


class ScriptedJudge(JudgeBackend):
    """A backend that replies with fixed text: for mapping cases the oracle server cannot produce."""

    def __init__(self, reply: str) -> None:
        super().__init__(JudgeConfig(name="scripted", backend="openai", model="m", api_key="k"))
        self.reply = reply

    async def complete(self, system: str, user: UserTurn, images: Sequence[ImageRef] = ()) -> JudgeResult:
        return JudgeResult(self.reply, 1, 1, 0.25)

    async def aclose(self) -> None:
        pass


async def test_unfaithful_step_typed_reasoning_counts_as_perception() -> None:
    reply = "Sentence 1: REASONING\nSentence 2: REASONING\n[Faithfulness]: UNFAITHFUL\n"
    reply += "[First unfaithful sentence]: Sentence 2"
    detector = JudgeDetector({"scripted": ScriptedJudge(reply)}, "scripted")
    verdicts = (await detector.check(context(), steps("a", "b", kind=R))).verdicts
    assert [(v.faithfulness, v.kind) for v in verdicts] == [(F, R), (U, P)]
    assert verdicts[0].latency_s == 0.25


async def test_untyped_steps_keep_their_own_kind() -> None:
    detector = JudgeDetector({"scripted": ScriptedJudge("[Faithfulness]: FAITHFUL")}, "scripted")
    verdicts = (await detector.check(context(), steps("a", kind=R) + steps("b", start=1, kind=P))).verdicts
    assert [v.kind for v in verdicts] == [R, P]


def test_description_cache_is_a_bounded_lru() -> None:
    cache = DescriptionCache(max_entries=2)
    cache.put(("j", ("a",)), "A")
    cache.put(("j", ("b",)), "B")
    assert cache.get(("j", ("a",))) == "A"  # a is now the most recent
    cache.put(("j", ("c",)), "C")
    assert cache.get(("j", ("b",))) is None and cache.get(("j", ("a",))) == "A" and len(cache) == 2
    disabled = DescriptionCache(max_entries=0)
    disabled.put(("j", ("a",)), "A")
    assert len(disabled) == 0


async def test_none_detector_checks_nothing() -> None:
    verdicts = (await NoneDetector().check(context(), steps("a", "b"))).verdicts
    assert [(v.faithfulness, v.detector, v.reason) for v in verdicts] == [(N, "none", "detector_none")] * 2


async def test_a_stand_in_judge_with_logprobs_gives_its_confidence_and_an_unsure_flag() -> None:
    """The local judge's OpenAI replies carry log-probabilities when asked and set (`flag_confidence`):
    the flag's confidence is read from them, and under the request's threshold the flag is UNSURE and
    the judge is asked again about the steps after it (the deploy test's `unsure` traffic relies on it)."""
    app = create_app(ORACLE)
    app.state.judge.flag_confidence = 0.6
    async with running_judge_server(app) as url:
        judge = build_judge(local_judge_config("openai", url, timeout_s=ANSWERED_TIMEOUT_S))
        detector = JudgeDetector({judge.name: judge}, judge.name)
        try:
            new = steps("The man wears a red scarf.", "The basket is empty.")
            sure = (await detector.check(context(), new)).verdicts
            unsure = (await detector.check(context(options={"flag_threshold": 0.7}), new)).verdicts
        finally:
            await detector.aclose()
    assert [v.faithfulness for v in sure] == [U, N] and sure[0].confidence == pytest.approx(0.6)
    assert [v.faithfulness for v in unsure] == [Faithfulness.UNSURE] * 2  # the second flag, asked again, too
    assert unsure[0].confidence == pytest.approx(0.6) and unsure[0].reason == f"judge:{judge.name}:unsure"
