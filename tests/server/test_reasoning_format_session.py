"""The session's continuation per reasoning format, on a scripted upstream that streams what vLLM's
reasoning parsers stream: the partial message it sends, the fields its rounds' text goes out in, and
the think block the Qwen3 template cannot leave open. Against real vLLM: tests/integration/
test_reasoning_formats.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from faithproxy.clients.vllm import VLLMClient
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.admission.policy import RequestPolicy, policy_from_headers
from faithproxy.server.chain.session import ChainSession, EmitEnd, EmitText
from faithproxy.server.observe.metrics import Metrics
from faithproxy.server.settings import Settings
from tests.server.test_session import BAD, Fixer, FlagBad, sse

USAGE = {"prompt_tokens": 10, "completion_tokens": 5}


async def run(
    rounds: list[bytes], fmt: str, *, mode: str = "correct", **body: Any
) -> tuple[list[Any], list[dict[str, Any]]]:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=rounds[len(bodies) - 1], headers={"content-type": "text/event-stream"})

    generator = VLLMClient("http://vllm.test", transport=httpx.MockTransport(handler))
    messages = [{"role": "user", "content": "What colour is the car?"}]
    session = ChainSession(
        settings=Settings(reasoning_format=fmt),
        policy=RequestPolicy(mode, "judge", 3, None, "pass", True),  # type: ignore[arg-type]
        view=RequestView("r1", "m", messages, "What colour is the car?"),
        generator=generator,
        detector=FlagBad(),
        regenerator=Fixer(),
        metrics=Metrics(CollectorRegistry(), ["judge"]),
        body={"model": "m", "messages": messages, "max_tokens": 100, **body},
    )
    events = [e async for e in session.run()]
    await generator.aclose()
    assert isinstance(events[-1], EmitEnd)
    return events, bodies


def texts(events: list[Any]) -> list[tuple[str, str]]:
    return [(e.field, e.text) for e in events if isinstance(e, EmitText)]


def fields(events: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, text in texts(events):
        out[name] = out.get(name, "") + text
    return out


async def test_qwen3_cut_inside_the_thinking_is_closed_as_its_template_would() -> None:
    # The generation prompt opened <think>: the parser streams the thinking with no marker at all.
    first = sse([{"reasoning": "I see a car."}, {"reasoning": f" {BAD} It is parked.\n"}], USAGE)
    # The template closed the block after the accepted text; a parser that starts every stream inside the
    # thinking (vLLM 0.32's reads the prompt instead) puts the answer in `reasoning`: it is answer text.
    second = sse([{"reasoning": "The car is red."}], USAGE)
    events, bodies = await run([first, second], "qwen3")
    assert texts(events) == [
        ("reasoning", "I see a car."),
        ("reasoning", " The car is red."),
        ("reasoning", "\n"),
        ("content", "\n\n"),
        ("content", "The car is red."),
    ]
    assert bodies[1]["messages"][-1] == {"role": "assistant", "content": "I see a car. The car is red.\n</think>\n\n"}


async def test_the_legacy_reasoning_content_name_is_kept() -> None:
    # Older vLLM versions name the field `reasoning_content`: the client hears the name vLLM used.
    first = sse([{"reasoning_content": "I see a car."}, {"reasoning_content": f" {BAD} It is parked.\n"}], USAGE)
    second = sse([{"reasoning_content": "The car is red."}], USAGE)
    events, _ = await run([first, second], "qwen3")
    assert fields(events) == {"reasoning_content": "I see a car. The car is red.\n", "content": "\n\nThe car is red."}


async def test_qwen3_cut_in_the_answer_is_continued_as_answer_text() -> None:
    first = sse([{"reasoning": "I see a car.\n"}, {"content": f"\n\n{BAD} So it is blue."}], USAGE)
    second = sse([{"reasoning": " So it is red."}], USAGE)
    events, bodies = await run([first, second], "qwen3")
    assert fields(events) == {"reasoning": "I see a car.\n", "content": "\n\nThe car is red. So it is red."}
    assert bodies[1]["messages"][-1]["content"] == "I see a car.\n</think>\n\nThe car is red."


async def test_qwen3_without_a_parser_gets_the_marker_in_content() -> None:
    first = sse([{"content": f"I see a car. {BAD} It is parked.\n</think>\n\nBlue."}], USAGE)
    second = sse([{"content": "Red."}], USAGE)
    events, bodies = await run([first, second], "qwen3")
    assert fields(events) == {"content": "I see a car. The car is red.\n</think>\n\nRed."}
    assert bodies[1]["messages"][-1]["content"] == "I see a car. The car is red.\n</think>\n\n"


async def test_think_prompt_resumes_inside_the_thinking() -> None:
    first = sse([{"reasoning": f"I see a car. {BAD} It is parked.\n"}, {"content": "\n\nBlue."}], USAGE)
    second = sse([{"reasoning": " It is parked.\n"}, {"content": "\n\nRed."}], USAGE)
    events, bodies = await run([first, second], "think_prompt")
    assert fields(events) == {"reasoning": "I see a car. The car is red. It is parked.\n", "content": "\n\nRed."}
    assert bodies[1]["messages"][-1]["content"] == "<think>\nI see a car. The car is red."


async def test_glm_answer_block_after_a_fix_in_it() -> None:
    first = sse([{"reasoning": "I see a car."}, {"content": f"<answer>{BAD} So B.</answer>"}], USAGE)
    second = sse([{"reasoning": " So A.</answer>"}], USAGE)
    events, bodies = await run([first, second], "think_answer")
    assert fields(events) == {"reasoning": "I see a car.", "content": "<answer>The car is red. So A.</answer>"}
    assert bodies[1]["messages"][-1]["content"] == "<think>I see a car.</think><answer>The car is red."
    steps = [e.step.text for e in events if isinstance(e, EmitText) and e.step is not None]
    assert steps == ["I see a car.", "The car is red.", "So A."]  # no marker in a step's text


@pytest.mark.parametrize("mode", ["correct", "detect"])
async def test_include_reasoning_false_is_read_and_checked_but_not_sent(mode: str) -> None:
    first = sse([{"reasoning": f"I see a car. {BAD}\n"}, {"content": "\n\nBlue."}], USAGE)
    second = sse([{"reasoning": "Red."}], USAGE)
    events, bodies = await run([first, second], "qwen3", mode=mode, include_reasoning=False)
    assert "include_reasoning" not in bodies[0]  # vLLM must send the thinking: the proxy checks it
    if mode == "correct":
        assert fields(events) == {"content": "\n\nRed."}
    else:
        assert fields(events) == {"content": "\n\nBlue."} and len(bodies) == 1


def test_the_header_names_a_format_and_refuses_unknown_ones() -> None:
    settings = Settings(default_detector="none")
    policy = policy_from_headers({"x-faithproxy-reasoning-format": "qwen3"}, settings, detectors=["none"], judges=[])
    assert policy.reasoning_format == "qwen3"
    assert policy_from_headers({}, settings, detectors=["none"], judges=[]).reasoning_format is None
    with pytest.raises(PolicyError, match="think_answer"):
        policy_from_headers({"x-faithproxy-reasoning-format": "glm"}, settings, detectors=["none"], judges=[])


def test_the_setting_refuses_unknown_formats() -> None:
    assert Settings(reasoning_format="plain").reasoning_format == "plain"
    with pytest.raises(ValueError, match="unknown reasoning format"):
        Settings(reasoning_format="glm")
