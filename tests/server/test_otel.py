"""OpenTelemetry traces (server/observe/otel.py) read back from the SDK's in-memory exporter: the real proxy
(uvicorn on 127.0.0.1) in front of a fake vLLM (a chain with a planted unfaithful sentence) and the
local judge server, both real on the wire. Also: off without OTEL_* variables; a collector that fails
every export leaves requests untouched and counts the dropped spans.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from faithproxy.server.observe import otel
from faithproxy.testing import FakeUpstream, frames, metric
from tests.support import planted_chain_proxy

N, SEED, PLANTED = 6, 1, 2
BODY = {"model": "chain-model", "messages": [{"role": "user", "content": f"chain n={N} seed={SEED} planted={PLANTED}"}]}


@contextlib.asynccontextmanager
async def proxy(
    monkeypatch: pytest.MonkeyPatch, exporter: SpanExporter | None, **settings: Any
) -> AsyncIterator[tuple[str, FakeUpstream]]:
    if exporter is not None:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setattr(otel, "_exporter", lambda environ: exporter)
    async with planted_chain_proxy(N, SEED, PLANTED, **settings) as served:
        yield served


async def test_a_corrected_request_reads_back_as_a_span_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    async with proxy(monkeypatch, exporter) as (url, vllm), httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{url}/v1/chat/completions", json={**BODY, "stream": True})
        assert response.status_code == 200
        await http.get(f"{url}/metrics")  # not an API path: no span
    # the lifespan's end flushed the queue
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    assert server.name == "POST /v1/chat/completions"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gen_ai.request.model"] == "chain-model"
    assert server.attributes["faithproxy.mode"] == "correct" and server.attributes["faithproxy.key_policy"] == "default"
    clients = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert clients and all(s.parent is not None and s.parent.span_id == server.context.span_id for s in clients)
    assert all(s.context.trace_id == server.context.trace_id for s in clients)
    upstream = [s for s in clients if s.attributes["gen_ai.provider.name"] == "vllm"]
    judges = [s for s in clients if s.attributes["gen_ai.provider.name"] == "anthropic"]
    assert len(upstream) == len([r for r in vllm.requests if r.url.path == "/v1/chat/completions"]) >= 2
    assert judges and all(s.name == "chat judge-model" for s in judges)
    for span in judges:
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.request.model"] == "judge-model"
        assert span.attributes["gen_ai.usage.output_tokens"] > 0 and span.attributes["gen_ai.usage.input_tokens"] > 0
        assert "gen_ai.usage.cache_read.input_tokens" in span.attributes
    first = upstream[0]  # the first round: a stream ended by its usage chunk
    assert first.name == "chat chain-model" and first.attributes["gen_ai.request.model"] == "chain-model"
    assert any("gen_ai.usage.output_tokens" in s.attributes for s in upstream)
    assert any(s.attributes.get("gen_ai.response.finish_reasons") for s in upstream)
    # vLLM was sent the W3C traceparent of each upstream span
    sent = [r.headers.get("traceparent", "") for r in vllm.requests if r.url.path == "/v1/chat/completions"]
    expected = {f"00-{s.context.trace_id:032x}-{s.context.span_id:016x}" for s in upstream}
    assert {header.rsplit("-", 1)[0] for header in sent} == expected
    # one evaluation event per checked step; the planted step fixed
    events = [e for e in server.events if e.name == "gen_ai.evaluation.result"]
    assert events and all(e.attributes["gen_ai.evaluation.name"] == "faithfulness" for e in events)
    labels = [e.attributes["gen_ai.evaluation.score.label"] for e in events]
    (end,) = [f for f in frames(response.text) if '"finish_reason": "stop"' in f or '"finish_reason":"stop"' in f]
    expected_labels = [label for label in map(_label, json.loads(end)["faithfulness"]["steps"]) if label]
    assert labels == expected_labels and labels.count("fixed") == 1
    assert [e.attributes["faithproxy.step.index"] for e in events] == [
        step["index"] for step in json.loads(end)["faithfulness"]["steps"] if _label(step)
    ]
    (fixed,) = [e for e in events if e.attributes["gen_ai.evaluation.score.label"] == "fixed"]
    assert fixed.attributes.get("gen_ai.evaluation.explanation")


def _label(step: dict[str, Any]) -> str | None:
    """The evaluation label a step's annotation (the `faithfulness` summary) implies."""
    if step.get("unchecked_reason") == "detector_none":
        return None
    if step.get("unchecked_reason"):
        return "unchecked"
    if step["detected"] == "unknown":
        return None
    if step["regenerated"] and not step["residual"]:
        return "fixed"
    if step["residual"]:
        return "residual"
    return "unfaithful" if step["detected"] == "unfaithful" else "faithful"


async def test_off_without_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert not otel.enabled()
    assert otel.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not otel.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    assert not otel.enabled({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    async with proxy(monkeypatch, None) as (url, vllm), httpx.AsyncClient(timeout=30) as http:
        assert (await http.post(f"{url}/v1/chat/completions", json=BODY)).status_code == 200
    assert all("traceparent" not in r.headers for r in vllm.requests)


class DownCollector(SpanExporter):
    """A collector that is down: every export fails."""

    def __init__(self) -> None:
        self.tries = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.tries += 1
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


async def test_a_collector_down_changes_no_answer_and_counts_the_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = DownCollector()
    async with proxy(monkeypatch, collector) as (url, _), httpx.AsyncClient(timeout=30) as http:
        answers = [await http.post(f"{url}/v1/chat/completions", json={**BODY, "stream": s}) for s in (False, True)]
        assert [a.status_code for a in answers] == [200, 200]
        assert answers[0].json()["faithfulness"]["fixed"] == 1
        app_exporter_flushed = False
        for _ in range(100):  # the export thread runs every 50 ms (OTEL_BSP_SCHEDULE_DELAY)
            text = (await http.get(f"{url}/metrics")).text
            if metric(text, "faithproxy_otel_spans_dropped_total") > 0:
                app_exporter_flushed = True
                break
            await _sleep()
    assert app_exporter_flushed and collector.tries >= 1


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.05)


def test_step_labels() -> None:
    from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict

    def step(**kwargs: Any) -> Step:
        return Step(index=0, text="t", raw="t", kind=StepKind.PERCEPTION, **kwargs)

    flag = Verdict(Faithfulness.UNFAITHFUL, "judge", reason="no purple")
    ok = Verdict(Faithfulness.FAITHFUL, "judge")
    assert otel.step_label(step()) is None
    assert otel.step_label(step(first_verdict=ok)) == "faithful"
    assert otel.step_label(step(first_verdict=flag, residual=True)) == "residual"
    assert otel.step_label(step(first_verdict=flag, original_text="x")) == "fixed"
    assert otel.step_label(step(first_verdict=flag)) == "unfaithful"
    assert otel.step_label(step(unchecked_reason="budget", residual=True)) == "unchecked"
    assert otel.step_label(step(unchecked_reason="detector_none", residual=True)) is None  # nothing was checked


def test_a_stream_span_reads_only_the_last_events() -> None:
    """The upstream span's usage and finish reason come from the stream's last events; the chunks before
    them are not parsed (a cut first event, or a broken one, is skipped)."""
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"abcd"},"finish_reason":null}]}\n\n'
    finish = b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    usage = b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":800}}\n\n'
    tail = b'tent":"ab"}}]}\n\n' + chunk * 800 + finish + usage + b"data: [DONE]\n\n"
    found = otel._payloads(tail, stream=True)
    assert len(found) == 3 and found[-1]["usage"]["completion_tokens"] == 800
    assert found[-2]["choices"][0]["finish_reason"] == "stop"
    assert otel._payloads(b'ntent":"ab"}}]}\n\n' + finish + b"data: [DONE]", stream=True)[-1]["id"] == "c1"
    assert otel._payloads(b'{"id":"x","usage":{}}', stream=False) == [{"id": "x", "usage": {}}]
    assert otel._payloads(b"data: [DONE]\n\n", stream=True) == []
