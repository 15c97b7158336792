"""The consistency detector against REAL vLLM (the fixture model): its samples, its votes, every door.

The fixture model is trained to write one chain per image, so at a low temperature its samples repeat
its own sentence: its own steps are supported by every sample, and a sentence it would never write is
supported by none. That is also the detector's known limit, shown here on the planted step: an error
the model makes with confidence is one its samples repeat, so it passes.
"""

from __future__ import annotations

from typing import Any

import pytest

from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.clients.vllm import VLLMClient
from faithproxy.detectors.claim_readers import claim_reader
from faithproxy.detectors.consistency import ConsistencyDetector
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.types import Faithfulness, Step, StepKind
from faithproxy.testing import metric
from tests.integration import test_proxy_vllm as chat_door
from tests.integration.test_doors_vllm import ask_messages, responses_input
from tests.integration.test_proxy_vllm import Stack, request

pytestmark = [pytest.mark.integration]

stack = chat_door.stack
COOL = {"consistency_temperature": 0.05, "consistency_samples": 4, "default_detector": "consistency"}
HEADERS = {"X-Faithproxy-Detector": "consistency"}


def _step(index: int, text: str, first: bool) -> Step:
    raw = ("<think>\n" if first else " ") + text
    return Step(index=index, text=text, raw=raw, kind=StepKind.PERCEPTION)


async def test_own_step_is_supported_and_a_foreign_one_is_not(vllm_server: Any) -> None:
    generator = VLLMClient(vllm_server.base_url)
    detector = ConsistencyDetector(generator, claim_reader("words"), samples=4, temperature=0.05, max_tokens=24)
    body = request("green_circle", vllm_server.model)
    view = RequestView("r1", vllm_server.model, body["messages"], spec.get("green_circle").question)
    own = spec.get("green_circle").sentences[0]
    try:
        result = await detector.check(view, [_step(0, own, True)])
        (verdict,) = result.verdicts
        assert verdict.faithfulness is Faithfulness.FAITHFUL and verdict.score == 0.0
        assert verdict.reason == "4 of 4 samples agree"
        assert result.usage.completion_tokens > 0 and detector.requests == 1

        # the same prefix again (a rewrite's check): the request's samples are reused, nothing is sent
        foreign = await detector.check(view, [_step(0, "There is a purple cross in the top corner.", True)])
        (verdict,) = foreign.verdicts
        assert verdict.faithfulness is Faithfulness.UNFAITHFUL and verdict.score == 1.0
        assert verdict.reason == "0 of 4 samples agree"
        assert detector.requests == 1 and foreign.usage.completion_tokens == 0
    finally:
        await generator.aclose()


@pytest.mark.parametrize("stack_settings", [COOL])
async def test_every_door_checks_with_the_generators_samples(stack: Stack, stack_settings: Any) -> None:
    """Chat (openai SDK, detect and correct), Responses and Messages: every perception step is voted on."""
    chat = await stack.client.chat.completions.create(
        **request("red_circle", stack.model), extra_headers=HEADERS | {"X-Faithproxy-Mode": "detect"}
    )
    summary = chat.model_extra["faithfulness"]
    verdicts = [s for s in summary["steps"] if s["kind"] == "perception"]
    assert len(verdicts) == 3 and all(s["verdict"] == "faithful" for s in verdicts)
    # the planted "The circle is blue." is the model's confident error: its samples repeat it
    assert chat.choices[0].message.content == spec.chain_text(spec.get("red_circle"))
    assert chat.usage.completion_tokens > len(spec.chain_text(spec.get("red_circle")).split())  # samples billed

    corrected = await stack.client.chat.completions.create(
        **request("green_circle", stack.model), extra_headers=HEADERS
    )
    assert corrected.model_extra["faithfulness"]["unfaithful_detected"] == 0
    assert corrected.model_extra["faithfulness"]["perception_steps"] == 3

    response = await stack.client.responses.create(
        model=stack.model,
        input=responses_input("green_circle"),
        max_output_tokens=200,
        temperature=0.0,
        extra_headers=HEADERS,
    )
    assert response.model_extra["faithfulness"]["perception_steps"] == 3

    message = await ask_messages(stack, "green_circle", HEADERS)
    assert message.model_extra["faithfulness"]["perception_steps"] == 3

    metrics = await stack.metrics()
    checked = metric(metrics, "faithproxy_steps_total", kind="perception", verdict="faithful", detector="consistency")
    assert checked == 12  # 3 perception steps in each of the four requests
    assert metric(metrics, "faithproxy_detector_errors_total", detector="consistency") == 0


@pytest.mark.parametrize("stack_settings", [COOL])
async def test_a_bad_threshold_header_is_refused(stack: Stack, stack_settings: Any) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match="x-faithproxy-consistency-threshold"):
        await stack.client.chat.completions.create(
            **request("green_circle", stack.model), extra_headers=HEADERS | {"X-Faithproxy-Consistency-Threshold": "2"}
        )


@pytest.mark.parametrize("stack_settings", [COOL | {"shadow_share": 1.0, "shadow_detector": "consistency"}])
async def test_a_shadow_check_votes_with_the_generators_samples(stack: Stack, stack_settings: Any) -> None:
    """An off request, sampled for a shadow check: the client gets vLLM's chain, and the check afterwards
    reads the same three perception steps with the generator's samples."""
    off = await stack.client.chat.completions.create(
        **request("green_circle", stack.model), extra_headers={"X-Faithproxy-Mode": "off"}
    )
    assert off.choices[0].message.content == spec.chain_text(spec.get("green_circle"))
    metrics = await stack.shadow_checked(3)  # the check runs after the response, in the background
    assert metric(metrics, "faithproxy_perception_steps_total", source="shadow") == 3
    assert metric(metrics, "faithproxy_perception_steps_total", source="shadow", verdict="faithful") == 3
    assert metric(metrics, "faithproxy_shadow_requests_total", outcome="checked") == 1
