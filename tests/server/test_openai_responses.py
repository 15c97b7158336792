"""POST /v1/responses (OpenAI Responses API): the chat door's session driven from a Responses request,
answered in Responses events, through a real uvicorn proxy, a FakeUpstream and the official openai SDK
(`responses.create`, streamed and not, the `responses.stream` helper, `output_text`); reasoning as a
reasoning item; refusals in detect/correct that off passes through. Real vLLM:
tests/integration/test_doors_vllm.py.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.app import create_app
from faithproxy.server.doors.responses import chat_body
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, metric, running_app
from faithproxy.testing.answer import Stream
from faithproxy.testing.wire import DONE, delta, event, usage_chunk

PNG = "data:image/png;base64,iVBORw0KGgo="
EXPECTED = "".join(Sentences().sentences)


def test_chat_body_from_a_responses_request() -> None:
    request = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Answer in English."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": PNG, "detail": "low"},
                    {"type": "input_text", "text": "What colour?"},
                ],
            },
        ],
        "max_output_tokens": 64,
        "temperature": 0.0,
        "reasoning": {"effort": "low"},
        "stream": True,
    }
    assert chat_body(request) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": "Answer in English."},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
                    {"type": "text", "text": "What colour?"},
                ],
            },
        ],
        "stream": True,
        "max_tokens": 64,
        "temperature": 0.0,
        "reasoning_effort": "low",
    }
    assert chat_body({"model": "m", "input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]


class Thinking:
    """A reasoning-parser vLLM: the chain in `reasoning`, then the answer in `content`."""

    model = "m"

    def stream(self, body: dict[str, Any]) -> Stream:
        chunks = [delta("I see a circle. ", field="reasoning"), delta("It is red.", field="reasoning")]
        chunks.append(delta("The answer is red.", "stop"))
        return Stream((), tuple(event(c) for c in chunks), (event(usage_chunk()), DONE))

    def reply(self, body: dict[str, Any]) -> Any:
        raise AssertionError("streamed only")


@pytest.fixture
async def proxy() -> Any:
    upstream = FakeUpstream(Sentences())
    settings = Settings(upstream_url="http://vllm.test", default_detector="none", max_tokens_cap=64)
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        yield url, upstream


def client(url: str, mode: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="x", max_retries=0, default_headers={"x-faithproxy-mode": mode, **headers}
    )


@pytest.mark.parametrize("mode", ["detect", "correct"])
async def test_openai_sdk_responses(proxy: Any, mode: str) -> None:
    url, upstream = proxy
    sdk = client(url, mode, **{"x-faithproxy-annotate": "true"})
    whole = await sdk.responses.create(model="m", input="What colour?", instructions="Be brief.", max_output_tokens=32)
    assert whole.output_text == EXPECTED and whole.status == "completed"
    assert whole.usage is not None and whole.usage.output_tokens > 0
    assert (whole.model_extra or {})["faithfulness"]["mode"] == mode

    stream = await sdk.responses.create(model="m", input=[{"role": "user", "content": "hi"}], stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == EXPECTED
    assert (events[-1].response.model_extra or {})["faithfulness"]["mode"] == mode
    if mode == "correct":  # one delta per verified step, each with its annotation
        steps = [(e.model_extra or {}).get("faithfulness") for e in events if e.type == "response.output_text.delta"]
        assert len(steps) == 3 and all(s and "step" in s for s in steps)

    async with sdk.responses.stream(model="m", input="hi") as helper:
        async for _ in helper:
            pass
        final = await helper.get_final_response()
    assert final.output_text == EXPECTED
    await sdk.close()
    sent = [json.loads(r.content) for r in upstream.requests if r.url.path == "/v1/chat/completions"]
    assert len(sent) == 3 and sent[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent[0]["max_tokens"] == 32


async def test_reasoning_becomes_a_reasoning_item() -> None:
    upstream = FakeUpstream(Thinking())
    settings = Settings(upstream_url="http://vllm.test", default_detector="none")
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        sdk = client(url, "correct")
        stream = await sdk.responses.create(model="m", input="hi", stream=True)
        events = [e async for e in stream]
        await sdk.close()
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thinking == "I see a circle. It is red."
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == "The answer is red."
    # The client's next turn sends that output back as input (the SDK's own items): the reasoning item is
    # the assistant message's `reasoning`, its message item the content, in one assistant message.
    history = [{"role": "user", "content": "hi"}, *[item.model_dump(exclude_none=True) for item in final.output]]
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        sdk = client(url, "correct")
        again = await sdk.responses.create(model="m", input=[*history, {"role": "user", "content": "Sure?"}])
        await sdk.close()
    assert again.output_text == "The answer is red."
    sent = [json.loads(r.content) for r in upstream.requests if r.url.path == "/v1/chat/completions"][-1]
    assert sent["messages"][:3] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "reasoning": "I see a circle. It is red.",
         "content": [{"type": "text", "text": "The answer is red."}]},
        {"role": "user", "content": "Sure?"},
    ]  # fmt: skip


def test_input_reasoning_items_map_as_vllm_maps_them() -> None:
    """A reasoning item alone, its summary when it has no content, and encrypted content (a 400)."""
    summary_only = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Short."}]}
    body = chat_body({"model": "m", "input": [summary_only, {"role": "user", "content": "next"}]})
    assert body["messages"] == [
        {"role": "assistant", "reasoning": "Short.", "content": ""},
        {"role": "user", "content": "next"},
    ]
    with pytest.raises(PolicyError, match=r"input\[0\]: encrypted"):
        chat_body({"model": "m", "input": [{**summary_only, "encrypted_content": "gAAA"}, "next"]})


async def test_off_mode_passes_vllm_responses_through(proxy: Any) -> None:
    url, upstream = proxy
    async with httpx.AsyncClient(timeout=10) as http:
        raw = json.dumps({"model": "m", "input": "hi", "previous_response_id": "resp_1", "store": True}).encode()
        answer = await http.post(
            f"{url}/v1/responses", content=raw, headers={"x-faithproxy-mode": "off", "content-type": "application/json"}
        )
    assert answer.headers["x-faithproxy-mode"] == "off"
    forwarded = [r for r in upstream.requests if r.url.path == "/v1/responses"]
    assert len(forwarded) == 1
    # the client's body, with the server's token cap added under the Responses API's own name
    assert json.loads(forwarded[0].content) == {**json.loads(raw), "max_output_tokens": 64}
    assert answer.status_code == 404  # the fake serves no /v1/responses: its own answer comes back


# (what is wrong, the body, the modes that refuse it, the error's param)
REFUSALS = [
    ("no input", {"model": "m"}, ("off", "detect", "correct"), "input"),
    ("no model", {"input": "hi"}, ("off", "detect", "correct"), "model"),
    ("bad max_output_tokens", {"model": "m", "input": "hi", "max_output_tokens": 0}, ("off",), "max_output_tokens"),
    ("previous_response_id", {"model": "m", "input": "hi", "previous_response_id": "r"}, ("correct",), None),
    ("store", {"model": "m", "input": "hi", "store": True}, ("detect", "correct"), "store"),
    ("background", {"model": "m", "input": "hi", "background": True}, ("correct",), "background"),
    ("tools", {"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, ("detect",), "tools"),
    (
        "a file part",
        {"model": "m", "input": [{"role": "user", "content": [{"type": "input_file"}]}]},
        ("correct",),
        "input",
    ),
    (
        "max_output_tokens over the cap",
        {"model": "m", "input": "hi", "max_output_tokens": 100},
        ("off", "correct"),
        "max_output_tokens",
    ),
]


@pytest.mark.parametrize(("case", "payload", "modes", "param"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_refusals(
    proxy: Any, case: str, payload: dict[str, Any], modes: tuple[str, ...], param: str | None
) -> None:
    url, upstream = proxy
    async with httpx.AsyncClient(timeout=10) as http:
        for mode in modes:
            answer = await http.post(f"{url}/v1/responses", json=payload, headers={"x-faithproxy-mode": mode})
            assert answer.status_code == 400, (case, mode, answer.text)
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error", (case, mode)
            assert error["param"] == (param or case), (case, mode)
            if mode != "off" and param in (None, "store", "background", "tools"):
                assert "off" in error["message"]
        exposition = (await http.get(f"{url}/metrics")).text
    assert all(r.url.path == "/v1/models" for r in upstream.requests)  # nothing but the listing at start
    assert metric(exposition, "faithproxy_requests_total", mode="rejected", status="4xx") == len(modes)
