"""The loop of ChainSession on a scripted upstream (httpx.MockTransport) with scripted detector and
regenerator: what it sends to vLLM on continuation, and how it handles the reasoning channel.
The same loop against real vLLM is in tests/integration/test_proxy_vllm.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import httpx
from prometheus_client import CollectorRegistry

from faithproxy.clients.vllm import VLLMClient
from faithproxy.detectors.base import Detector
from faithproxy.faithcore.context import CheckResult, Regeneration, RequestView
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict
from faithproxy.regenerators.base import Regenerator
from faithproxy.server.admission.policy import RequestPolicy
from faithproxy.server.chain.session import ChainSession, EmitEnd, EmitText, EmitVerdicts
from faithproxy.server.observe.metrics import Metrics
from faithproxy.server.settings import Settings

BAD = "The car is blue."


class FlagBad(Detector):
    """Unfaithful iff the step's text is BAD; records what it was asked."""

    name: ClassVar[str] = "judge"
    types_steps: ClassVar[bool] = True

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        self.calls.append([s.text for s in new_steps])
        out = []
        for s in new_steps:
            kind = StepKind.PERCEPTION if "car" in s.text else StepKind.REASONING
            bad = s.text == BAD
            out.append(Verdict(Faithfulness.UNFAITHFUL if bad else Faithfulness.FAITHFUL, "judge", kind=kind))
        return CheckResult(tuple(out))


class Fixer(Regenerator):
    name: ClassVar[str] = "fixer"

    async def regenerate(self, view: RequestView, prefix: list[str], bad_step: Step, attempt: int) -> Regeneration:
        return Regeneration("The car is red.")


def sse(deltas: list[dict[str, Any]], usage: dict[str, int]) -> bytes:
    chunks = [{"id": "u", "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({"id": "u", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({"id": "u", "choices": [], "usage": usage})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


async def run_session(rounds: list[bytes]) -> tuple[list[Any], list[dict[str, Any]], ChainSession]:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=rounds[len(bodies) - 1], headers={"content-type": "text/event-stream"})

    generator = VLLMClient("http://vllm.test", transport=httpx.MockTransport(handler))
    messages = [{"role": "user", "content": "What colour is the car?"}]
    session = ChainSession(
        settings=Settings(),
        policy=RequestPolicy("correct", "judge", 3, None, "pass", True),
        view=RequestView("r1", "m", messages, "What colour is the car?"),
        generator=generator,
        detector=FlagBad(),
        regenerator=Fixer(),
        metrics=Metrics(CollectorRegistry(), ["judge"]),
        body={"model": "m", "messages": messages, "max_tokens": 100, "top_k": 5},
    )
    events = [e async for e in session.run()]
    await generator.aclose()
    return events, bodies, session


async def test_reasoning_channel_is_segmented_and_think_block_reopened_on_continuation() -> None:
    first = sse(
        [{"reasoning": "\nI see a car in the image."}, {"reasoning": f" {BAD} It is parked."}],
        {"prompt_tokens": 10, "completion_tokens": 9},
    )
    second = sse(
        [{"reasoning": " It is parked.\n"}, {"content": "\n\nThe car is red."}],
        {"prompt_tokens": 25, "completion_tokens": 6},
    )
    events, bodies, session = await run_session([first, second])

    texts = [(e.field, e.text) for e in events if isinstance(e, EmitText)]
    assert texts == [
        ("reasoning", "\nI see a car in the image."),
        ("reasoning", " The car is red."),
        ("reasoning", " It is parked."),
        ("reasoning", "\n"),
        ("content", "\n\nThe car is red."),
    ]
    assert isinstance(events[-1], EmitEnd) and events[-1].finish_reason == "stop"

    continuation = bodies[1]
    assert continuation["messages"][-1] == {
        "role": "assistant",
        "content": "<think>\nI see a car in the image. The car is red.",
    }
    assert continuation["continue_final_message"] is True and continuation["add_generation_prompt"] is False
    assert continuation["top_k"] == 5  # unknown fields travel on every round
    assert continuation["max_tokens"] < 100  # what the first round spent is taken off
    assert bodies[0]["stream"] is True and bodies[0]["stream_options"] == {"include_usage": True}

    fixed = [s for s in session.steps if s.original_text]
    assert [(s.original_text, s.text, s.attempts) for s in fixed] == [(BAD, "The car is red.", 1)]
    # The scripted first round arrives whole, usage included, before the flagged step is judged: both
    # rounds' usage is added up.
    assert session.result().usage["prompt_tokens"] == 35 and session.result().usage["completion_tokens"] == 15


async def test_steps_finished_while_the_detector_works_go_in_one_call() -> None:
    body = sse(
        [{"content": "I see a car. The car is red. It is parked. The sky is clear. "}, {"content": "Done."}],
        {"prompt_tokens": 5, "completion_tokens": 12},
    )
    events, bodies, session = await run_session([body])
    assert len(bodies) == 1
    calls = session.detector.calls  # type: ignore[attr-defined]
    # the scripted stream arrives at once, so every step is ready before the first check: one call
    assert calls == [["I see a car.", "The car is red.", "It is parked.", "The sky is clear.", "Done."]]


# ---- the driver around the correction core -----------------------------------------------------


class HeldStream(httpx.AsyncByteStream):
    """An upstream body that sends `head`, then keeps the stream open as a model still decoding would;
    records when the proxy closes it."""

    def __init__(self, head: bytes) -> None:
        self.head = head
        self.closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.head
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed.set()


def chunks(deltas: list[dict[str, Any]]) -> bytes:
    return b"".join(
        b"data: "
        + json.dumps({"id": "u", "choices": [{"index": 0, "delta": d, "finish_reason": None}]}).encode()
        + b"\n\n"
        for d in deltas
    )


def make_session(
    handler: Any, mode: str = "correct", regenerator: Regenerator | None = None
) -> tuple[ChainSession, VLLMClient]:
    generator = VLLMClient("http://vllm.test", transport=httpx.MockTransport(handler))
    messages = [{"role": "user", "content": "What colour is the car?"}]
    session = ChainSession(
        settings=Settings(),
        policy=RequestPolicy(mode, "judge", 3, None, "pass", True),  # type: ignore[arg-type]
        view=RequestView("r1", "m", messages, "What colour is the car?"),
        generator=generator,
        detector=FlagBad(),
        regenerator=regenerator or Fixer(),
        metrics=Metrics(CollectorRegistry(), ["judge"]),
        body={"model": "m", "messages": messages, "max_tokens": 100},
    )
    return session, generator


def sample(session: ChainSession, name: str, **labels: str) -> float:
    return session.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_detect_mode_streams_text_at_once_and_counts_the_verdicts_that_follow() -> None:
    body = sse(
        [{"content": "I see a car. "}, {"content": f"{BAD} "}, {"content": "It is parked."}],
        {"prompt_tokens": 5, "completion_tokens": 3},
    )
    session, generator = make_session(
        lambda request: httpx.Response(200, content=body, headers={"content-type": "text/event-stream"}), "detect"
    )
    events = [e async for e in session.run()]
    await generator.aclose()

    assert "".join(e.text for e in events if isinstance(e, EmitText)) == f"I see a car. {BAD} It is parked."
    assert all(e.step is None for e in events if isinstance(e, EmitText))  # raw deltas, not whole steps
    first_verdicts = next(i for i, e in enumerate(events) if isinstance(e, EmitVerdicts))
    assert isinstance(events[0], EmitText) and first_verdicts > 0
    checked = [s for e in events if isinstance(e, EmitVerdicts) for s in e.steps]
    assert [s.text for s in checked] == ["I see a car.", BAD, "It is parked."] == [s.text for s in session.steps]
    assert [(s.residual, s.residual_reason) for s in checked] == [(False, None), (True, "not_corrected"), (False, None)]
    assert isinstance(events[-1], EmitEnd) and events[-1].finish_reason == "stop"
    labels = {"detector": "judge", "model": "other"}
    assert sample(session, "faithproxy_steps_total", kind="perception", verdict="unfaithful", **labels) == 1
    assert sample(session, "faithproxy_steps_total", kind="perception", verdict="faithful", **labels) == 1
    assert sample(session, "faithproxy_residual_steps_total", reason="not_corrected", **labels) == 1
    assert session.result().usage["completion_tokens"] == 3 and session.result().rounds == 1


async def test_the_read_ahead_is_closed_before_the_flagged_step_is_regenerated() -> None:
    held = HeldStream(chunks([{"content": "I see a car. "}, {"content": f"{BAD} "}, {"content": "It is"}]))
    rest = sse([{"content": " It is parked."}], {"prompt_tokens": 20, "completion_tokens": 4})
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:
            return httpx.Response(200, stream=held, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, content=rest, headers={"content-type": "text/event-stream"})

    class SeesTheStream(Fixer):
        closed_before: list[bool] = []

        async def regenerate(self, view: RequestView, prefix: list[str], bad_step: Step, attempt: int) -> Regeneration:
            self.closed_before.append(held.closed.is_set())
            return await super().regenerate(view, prefix, bad_step, attempt)

    session, generator = make_session(handler, regenerator=SeesTheStream())
    events = [e async for e in session.run()]
    await generator.aclose()

    assert SeesTheStream.closed_before == [True]  # vLLM was told to stop before the rewrite was asked for
    assert [e.text for e in events if isinstance(e, EmitText)] == ["I see a car.", " The car is red.", " It is parked."]
    # the aborted round reported no usage: its three text deltas stand for its tokens, counted once
    assert bodies[1]["max_tokens"] == 97
    assert session.result().usage["completion_tokens"] == 3 + 4
    assert sample(session, "faithproxy_regeneration_attempts_total", outcome="fixed") == 1
    assert sample(session, "faithproxy_regeneration_outcomes_total", outcome="fixed", attempts="1") == 1


async def test_closing_a_detect_stream_closes_upstream_and_leaves_no_task() -> None:
    held = HeldStream(chunks([{"content": "I see a car. "}, {"content": "It is"}]))
    session, generator = make_session(
        lambda request: httpx.Response(200, stream=held, headers={"content-type": "text/event-stream"}), "detect"
    )
    before = asyncio.all_tasks()
    events = session.run()
    first = await anext(events)
    assert isinstance(first, EmitText) and first.text == "I see a car. "
    await events.aclose()  # what the response layer does when the client goes away
    await generator.aclose()

    assert held.closed.is_set()
    left = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert left == []


async def test_emits_that_come_without_a_wait_are_handed_over_as_one_batch() -> None:
    """A read that brings several tokens: detect mode's text deltas come as one batch (one write for the
    door), and the batches hold the same emits, in the same order, as `run()`."""
    body = sse(
        [{"content": "I see a car. "}, {"content": "It is"}, {"content": " parked."}],
        {"prompt_tokens": 5, "completion_tokens": 3},
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    session, generator = make_session(handler, "detect")
    batches = [batch async for batch in session.run_batches()]
    await generator.aclose()
    session, generator = make_session(handler, "detect")
    singles = [e async for e in session.run()]
    await generator.aclose()

    assert all(batches)
    assert any(len(batch) > 1 for batch in batches)
    flat = [e for batch in batches for e in batch]
    assert [type(e) for e in flat] == [type(e) for e in singles]
    assert [e.text for e in flat if isinstance(e, EmitText)] == [e.text for e in singles if isinstance(e, EmitText)]
    assert isinstance(flat[-1], EmitEnd)
