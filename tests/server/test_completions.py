"""POST /v1/completions: the same correction machine and driver as chat, through the completions wire.

The wire reader and the round body alone; a ChainSession on the completions wire correcting a planted
step (the continuation extends the prompt, no chat template); the door through a real uvicorn proxy and
the openai SDK, in the three modes, streamed and not; and its refusals, in OpenAI's error format,
counted, with nothing sent upstream. The same door against real vLLM is in
tests/integration/test_doors_vllm.py.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry

from faithproxy.clients.vllm import VLLMClient
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.correction import Delta, RoundEnd, StartRound
from faithproxy.faithcore.correction.wire import CompletionChunkReader
from faithproxy.faithcore.reasoning_formats import Continuation
from faithproxy.faithcore.types import Channel
from faithproxy.server.admission.policy import RequestPolicy
from faithproxy.server.app import create_app
from faithproxy.server.chain.session import ChainSession, EmitEnd, EmitText
from faithproxy.server.doors.completions import COMPLETIONS_WIRE, completions_round_body
from faithproxy.server.observe.metrics import Metrics
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, metric, running_app
from faithproxy.testing.answer import Stream
from faithproxy.testing.wire import DONE, event, text_delta, usage_chunk
from tests.server.test_session import BAD, Fixer, FlagBad

PROMPT = "<|user|>What colour is the car?<|assistant|>"


def test_wire_reader_reads_text_as_content() -> None:
    reader = CompletionChunkReader()
    assert reader.events(text_delta("The car ")) == [Delta("content", "The car ")]
    assert reader.events(text_delta("", "stop")) == []
    assert reader.events(usage_chunk(4, 2)) == []
    assert reader.end() == RoundEnd("stop", {"prompt_tokens": 4, "completion_tokens": 2}, "u1")


def test_round_body_extends_the_prompt_with_the_accepted_text() -> None:
    client = {"model": "m", "prompt": PROMPT, "max_tokens": 50, "top_k": 5, "stream": False}
    first = completions_round_body(client, StartRound())
    assert first == {**client, "stream": True, "stream_options": {"include_usage": True}}
    accepted = {Channel.REASONING: "", Channel.CONTENT: "I see a car. The car is red."}
    start = StartRound(accepted, 40, Continuation("ignored: no template", False, {}))
    later = completions_round_body(client, start)
    assert later["prompt"] == PROMPT + "I see a car. The car is red."
    assert later["max_tokens"] == 40 and later["top_k"] == 5
    assert "messages" not in later and "continue_final_message" not in later


class PlantedChain:
    """A completions upstream: the first round writes BAD; a round whose prompt carries the fix goes on."""

    model = "m"

    def stream(self, body: dict[str, Any]) -> Stream:
        texts = ["I see a car. ", f"{BAD} ", "It is parked."] if body["prompt"] == PROMPT else [" It is parked."]
        frames = [event(text_delta(t)) for t in texts] + [event(text_delta("", "stop"))]
        return Stream((), tuple(frames), (event(usage_chunk(5, 3)), DONE))

    def reply(self, body: dict[str, Any]) -> Any:
        raise AssertionError("the completions wire streams every round")


async def test_session_on_the_completions_wire_corrects_a_planted_step() -> None:
    upstream = FakeUpstream(PlantedChain())
    generator = VLLMClient("http://vllm.test", transport=upstream.transport())
    messages = [{"role": "user", "content": PROMPT}]
    session = ChainSession(
        settings=Settings(),
        policy=RequestPolicy("correct", "judge", 3, None, "pass", True),
        view=RequestView("r1", "m", messages, PROMPT),
        generator=generator,
        detector=FlagBad(),
        regenerator=Fixer(),
        metrics=Metrics(CollectorRegistry(), ["judge"]),
        body={"model": "m", "prompt": PROMPT, "max_tokens": 100},
        wire=COMPLETIONS_WIRE,
    )
    events = [e async for e in session.run()]
    await generator.aclose()
    text = "".join(e.text for e in events if isinstance(e, EmitText))
    assert text == "I see a car. The car is red. It is parked."
    assert BAD not in text
    assert isinstance(events[-1], EmitEnd) and events[-1].finish_reason == "stop"
    sent = [json.loads(r.content) for r in upstream.requests]
    assert [r.url.path for r in upstream.requests] == ["/v1/completions", "/v1/completions"]
    assert sent[1]["prompt"] == PROMPT + "I see a car. The car is red."
    assert sent[1]["max_tokens"] < 100
    assert session.result().usage["completion_tokens"] == 6


@pytest.fixture
async def proxy() -> Any:
    upstream = FakeUpstream(Sentences())
    settings = Settings(upstream_url="http://vllm.test", default_detector="none", max_tokens_cap=64)
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        yield url, upstream


@pytest.mark.parametrize("mode", ["off", "detect", "correct"])
async def test_openai_sdk_completions_in_every_mode(proxy: Any, mode: str) -> None:
    url, upstream = proxy
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", default_headers={"x-faithproxy-mode": mode})
    expected = "".join(Sentences().sentences)
    whole = await client.completions.create(model="m", prompt=PROMPT, max_tokens=32)
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "stop"
    stream = await client.completions.create(
        model="m", prompt=PROMPT, max_tokens=32, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    await client.close()
    assert {r.url.path for r in upstream.requests} - {"/v1/models"} == {"/v1/completions"}  # models: at start
    if mode != "off":
        summary = (whole.model_extra or {})["faithfulness"]
        assert summary["mode"] == mode and len(summary["steps"]) == 3
        last = [c for c in chunks if c.choices][-1]
        assert (last.model_extra or {})["faithfulness"]["mode"] == mode
        assert whole.id.startswith("cmpl-")


# (what is wrong, the body, the modes that refuse it, the error's param)
REFUSALS = [
    ("no prompt", {"model": "m"}, ("off", "detect", "correct"), "prompt"),
    ("prompt of the wrong type", {"model": "m", "prompt": {"a": 1}}, ("off", "detect", "correct"), "prompt"),
    ("no model", {"prompt": PROMPT}, ("off", "detect", "correct"), "model"),
    ("max_tokens over the cap", {"model": "m", "prompt": PROMPT, "max_tokens": 100}, ("off", "correct"), "max_tokens"),
    ("token-id prompt", {"model": "m", "prompt": [1, 2, 3]}, ("detect", "correct"), "prompt"),
    ("echo", {"model": "m", "prompt": PROMPT, "echo": True}, ("detect", "correct"), "echo"),
    ("logprobs", {"model": "m", "prompt": PROMPT, "logprobs": 2}, ("correct",), "logprobs"),
    ("n > 1", {"model": "m", "prompt": PROMPT, "n": 2}, ("detect",), "n"),
]


@pytest.mark.parametrize(("case", "payload", "modes", "param"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_refusals_in_openai_format_nothing_sent(
    proxy: Any, case: str, payload: dict[str, Any], modes: tuple[str, ...], param: str
) -> None:
    url, upstream = proxy
    async with httpx.AsyncClient(timeout=10) as http:
        for mode in modes:
            answer = await http.post(f"{url}/v1/completions", json=payload, headers={"x-faithproxy-mode": mode})
            assert answer.status_code == 400, (case, mode, answer.text)
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == param, (case, mode)
        exposition = (await http.get(f"{url}/metrics")).text
    assert all(r.url.path == "/v1/models" for r in upstream.requests)  # the listing at start, nothing else
    assert metric(exposition, "faithproxy_requests_total", mode="rejected", status="4xx") == len(modes)


async def test_openapi_describes_the_completions_door(proxy: Any) -> None:
    url, _ = proxy
    async with httpx.AsyncClient(timeout=10) as http:
        schema = (await http.get(f"{url}/openapi.json")).json()
    operation = schema["paths"]["/v1/completions"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("CompletionRequest")
    assert any(p["name"].lower() == "x-faithproxy-mode" for p in operation["parameters"])
    assert "prompt" in schema["components"]["schemas"]["CompletionRequest"]["required"]


DOOR_BODIES = {
    "/v1/completions": {"model": "m", "prompt": PROMPT, "max_tokens": 16},
    "/v1/responses": {"model": "m", "input": "hi", "max_output_tokens": 16},
    "/v1/messages": {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
}


async def test_every_door_reports_by_request_id_and_is_counted(proxy: Any) -> None:
    url, _ = proxy
    async with httpx.AsyncClient(timeout=10) as http:
        for path, payload in DOOR_BODIES.items():
            answer = await http.post(f"{url}{path}", json={**payload, "stream": path == "/v1/responses"},
                                     headers={"x-faithproxy-mode": "correct"})  # fmt: skip
            assert answer.status_code == 200, (path, answer.text)
            request_id = answer.headers["x-faithproxy-request-id"]
            report = await http.get(f"{url}/v1/faithfulness/{request_id}")
            assert report.status_code == 200 and report.json()["id"] == request_id, path
        exposition = (await http.get(f"{url}/metrics")).text
    assert metric(exposition, "faithproxy_requests_total", mode="correct", status="2xx") == 3
    for path in DOOR_BODIES:  # each under its door's endpoint label
        assert metric(exposition, "faithproxy_requests_total", mode="correct", endpoint=path) == 1, path
        assert metric(exposition, "faithproxy_request_duration_seconds_count", mode="correct", endpoint=path) == 1
    assert metric(exposition, "faithproxy_time_to_first_token_seconds_count", endpoint="/v1/responses") == 1
