"""The judge gate through the session driver: with FAITHPROXY_JUDGE_EVERY_STEP off (the default), a batch
in which the step typer finds no perception step goes to no detector, even one that types steps itself,
and its steps are counted as gated; with it on, that detector sees every batch as before."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry

from faithproxy.clients.vllm import VLLMClient
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.kinds import classify_step
from faithproxy.faithcore.types import StepKind
from faithproxy.server.admission.policy import RequestPolicy
from faithproxy.server.chain.session import ChainSession, EmitText
from faithproxy.server.observe.metrics import Metrics
from faithproxy.server.settings import Settings
from tests.server.test_session import Fixer, FlagBad, sse

REASONING_ONLY = ["Okay, let me think about the question.", "So the answer is B."]
WITH_PERCEPTION = ["Let me look at the image.", "The car is red.", "So the answer is A."]


async def run(sentences: list[str], settings: Settings) -> tuple[ChainSession, list[EmitText]]:
    body = sse([{"content": " ".join(sentences)}], {"prompt_tokens": 5, "completion_tokens": 12})
    generator = VLLMClient(
        "http://vllm.test",
        transport=httpx.MockTransport(
            lambda request: httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        ),
    )
    messages = [{"role": "user", "content": "What colour is the car?"}]
    session = ChainSession(
        settings=settings,
        policy=RequestPolicy("correct", "judge", 3, None, "pass", True),
        view=RequestView("r1", "m", messages, "What colour is the car?"),
        generator=generator,
        detector=FlagBad(),
        regenerator=Fixer(),
        metrics=Metrics(CollectorRegistry(), ["judge"]),
        body={"model": "m", "messages": messages, "max_tokens": 100},
    )
    session.metrics.preinit_model(session.model_label, ["judge"])
    events = [e async for e in session.run()]
    await generator.aclose()
    return session, [e for e in events if isinstance(e, EmitText) and e.step is not None]


def gated(session: ChainSession) -> float:
    labels = {"detector": "judge", "model": session.model_label}
    return session.metrics.registry.get_sample_value("faithproxy_gated_steps_total", labels) or 0.0


def test_the_gate_is_on_by_default() -> None:
    assert Settings().judge_every_step is False
    assert all(classify_step(s) is StepKind.REASONING for s in REASONING_ONLY)
    assert classify_step(WITH_PERCEPTION[1]) is StepKind.PERCEPTION


async def test_a_chain_without_perception_steps_never_reaches_the_judge() -> None:
    session, emitted = await run(REASONING_ONLY, Settings())
    assert session.detector.calls == []  # type: ignore[attr-defined]
    assert [e.step.text for e in emitted] == REASONING_ONLY
    assert [s.unchecked_reason for s in session.steps] == ["gated", "gated"]
    assert gated(session) == 2


async def test_judge_every_step_sends_the_judge_every_batch() -> None:
    session, emitted = await run(REASONING_ONLY, Settings(judge_every_step=True))
    assert session.detector.calls == [REASONING_ONLY]  # type: ignore[attr-defined]
    assert [e.step.text for e in emitted] == REASONING_ONLY
    assert [s.unchecked_reason for s in session.steps] == [None, None]
    assert gated(session) == 0


async def test_a_batch_with_a_perception_step_goes_whole_to_the_judge() -> None:
    session, emitted = await run(WITH_PERCEPTION, Settings())
    assert session.detector.calls == [WITH_PERCEPTION]  # type: ignore[attr-defined]
    assert [e.step.text for e in emitted] == WITH_PERCEPTION
    assert [s.kind for s in session.steps] == [StepKind.REASONING, StepKind.PERCEPTION, StepKind.REASONING]
    assert gated(session) == 0


def test_the_gate_reads_its_setting_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("FAITHPROXY_JUDGE_EVERY_STEP", "true")
    assert Settings().judge_every_step is True


def test_the_gated_series_exist_before_the_first_gated_step() -> None:
    registry = CollectorRegistry()
    Metrics(registry, ["judge"]).preinit_model("m", ["judge", "prompt"])
    for detector in ("judge", "prompt"):
        labels = {"detector": detector, "model": "m"}
        assert registry.get_sample_value("faithproxy_gated_steps_total", labels) == 0.0
