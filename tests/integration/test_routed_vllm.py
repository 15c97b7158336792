"""The routed detector against REAL vLLM (the fixture model) and a local judge: each claim kind reaches
the detector its route names, on the chat, Responses and Messages doors, in correct, detect and shadow.

Routes here: counts to the generator's own samples (consistency), everything else to the judge. The
fixture's planted error ("The circle is blue.") is an object claim, so the judge reads and corrects it;
routed to the samples instead (a request's own routes), it passes, as the consistency detector's known
limit says (tests/integration/test_consistency_vllm.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.testing import metric
from tests.integration import test_proxy_vllm as chat_door
from tests.integration.test_doors_vllm import ask_messages, responses_input
from tests.integration.test_proxy_vllm import Stack, request

pytestmark = [pytest.mark.integration]

stack = chat_door.stack
ROUTED = {
    "consistency_temperature": 0.05,
    "consistency_samples": 4,
    "routed_routes": "count=consistency,*=judge",
    "default_detector": "routed",
}
HEADERS = {"X-Faithproxy-Detector": "routed"}


def perception(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in summary["steps"] if s["kind"] == "perception"]


def routes_taken(trace: dict[str, Any]) -> list[str]:
    """The detector each perception step's first verdict came from (its reason in the trace:
    routed:<detector>:...)."""
    return [s["reason"].split(":")[1] for s in perception(trace)]


@pytest.mark.parametrize("stack_settings", [ROUTED])
async def test_each_kind_reaches_its_detector_on_every_door(stack: Stack, stack_settings: Any) -> None:
    chat = await stack.client.chat.completions.create(**request("red_circle", stack.model), extra_headers=HEADERS)
    summary = chat.model_extra["faithfulness"]
    assert summary["unfaithful_detected"] == 1 and summary["residual"] == 0  # the judge corrected the planted step
    assert chat.choices[0].message.content == spec.corrected_chain_text(spec.get("red_circle"))
    assert chat.usage.completion_tokens > len(chat.choices[0].message.content.split())  # samples billed

    # a request's own routes: everything to the samples, in detect mode on the Responses door
    response = await stack.client.responses.create(
        model=stack.model,
        input=responses_input("red_circle"),
        max_output_tokens=200,
        temperature=0.0,
        extra_headers=HEADERS | {"X-Faithproxy-Routes": "*=consistency", "X-Faithproxy-Mode": "detect"},
    )
    summary = response.model_extra["faithfulness"]
    assert (
        len(perception(summary)) == 3 and summary["unfaithful_detected"] == 0
    )  # the model's confident error: its samples repeat it

    message = await ask_messages(stack, "green_circle", HEADERS)
    summary = message.model_extra["faithfulness"]
    assert len(perception(summary)) == 3 and summary["unfaithful_detected"] == 0

    for _ in range(100):  # a trace is written as its request ends
        if len(stack.traces()) == 3:
            break
        await asyncio.sleep(0.1)
    chat_trace, responses_trace, messages_trace = stack.traces()
    assert routes_taken(chat_trace) == ["consistency", "judge", "judge"]  # one circle; near the edge; blue
    assert routes_taken(responses_trace) == ["consistency"] * 3  # the request's own routes
    assert routes_taken(messages_trace) == ["consistency", "judge", "judge"]

    metrics = await stack.metrics()
    assert metric(metrics, "faithproxy_steps_total", kind="perception", detector="routed") == 9
    assert metric(metrics, "faithproxy_detector_errors_total", detector="routed") == 0


@pytest.mark.parametrize("stack_settings", [ROUTED])
async def test_bad_routes_are_refused_before_anything_is_sent(stack: Stack, stack_settings: Any) -> None:
    import openai

    for bad, match in (("count=judge", "x-faithproxy-routes"), ("*=probe", "not built: probe")):
        with pytest.raises(openai.BadRequestError, match=match):
            await stack.client.chat.completions.create(
                **request("green_circle", stack.model), extra_headers=HEADERS | {"X-Faithproxy-Routes": bad}
            )
    metrics = await stack.metrics()
    assert metric(metrics, "faithproxy_steps_total", kind="perception", detector="routed") == 0


@pytest.mark.parametrize("stack_settings", [ROUTED | {"shadow_share": 1.0, "shadow_detector": "routed"}])
async def test_a_shadow_check_routes_too(stack: Stack, stack_settings: Any) -> None:
    """An off request, sampled for a shadow check: the client gets vLLM's chain untouched, and the check
    afterwards finds the planted step through the judge's route."""
    off = await stack.client.chat.completions.create(
        **request("red_circle", stack.model), extra_headers={"X-Faithproxy-Mode": "off"}
    )
    assert off.choices[0].message.content == spec.chain_text(spec.get("red_circle"))
    metrics = await stack.shadow_checked(3)  # the check runs after the response, in the background
    assert metric(metrics, "faithproxy_perception_steps_total", source="shadow") == 3
    assert metric(metrics, "faithproxy_perception_steps_total", source="shadow", verdict="unfaithful") == 1
