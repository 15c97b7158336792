"""faithproxy's OpenTelemetry traces in Arize Phoenix, a real collector people use to look at LLM traces:
`phoenix serve` from its own venv (.venv-phoenix, scripts/install_phoenix.sh) on 127.0.0.1, fed over
OTLP/HTTP, read back through its REST API (GET /v1/projects/default/spans/otlpv1?trace_id=...).

1. A verified request with one rewrite (the proxy in front of a fake vLLM chain with a planted
   sentence and the local judge): the span tree (one root, every upstream and judge call its child),
   the GenAI attributes, one `gen_ai.evaluation.result` event per checked step, `fixed` once.
2. Real vLLM started with `--otlp-traces-endpoint` at the same Phoenix: its own `llm_request` span
   joins faithproxy's trace, as the child of the upstream CLIENT span whose traceparent it received.

Both share one Phoenix (about 30 s to start); the second starts its own vLLM (the session's shared one
runs without the OTLP flag).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.benchmarks.tinyvlm.processes import free_port
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import Chain, FakeUpstream, frames, planted_sentence, threaded_app
from tests.conftest import _require
from tests.server.test_otel import _label

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
PHOENIX = ROOT / ".venv-phoenix" / "bin" / "phoenix"
N, SEED, PLANTED = 6, 1, 2
EVALUATION = "gen_ai.evaluation.result"


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Phoenix's base URL (its UI, REST API and OTLP/HTTP receiver share the port)."""
    if not PHOENIX.exists():
        message = f"Arize Phoenix is not installed at {PHOENIX} (bash scripts/install_phoenix.sh)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must install it rather than skip the Phoenix tests")
        pytest.skip(message)
    work = tmp_path_factory.mktemp("phoenix")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))}
    env |= {
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_WORKING_DIR": str(work),  # its SQLite database
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    url = f"http://127.0.0.1:{port}"
    with processes.supervised():
        child = processes.spawn([str(PHOENIX), "serve"], work / "phoenix.log", name="Phoenix", env=env, cwd=work)
        child.wait_healthy(f"{url}/healthz", 180)
        yield url


def _value(any_value: dict[str, Any]) -> Any:
    for kind in ("string_value", "int_value", "double_value", "bool_value"):
        if any_value.get(kind) is not None:
            return any_value[kind]
    array = any_value.get("array_value")
    return [_value(v) for v in array["values"]] if array else None


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {item["key"]: _value(item["value"]) for item in items or ()}


def _trace(phoenix: str, trace_id: str, until: Any, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The trace's spans as Phoenix serves them, once `until(spans)` holds (export and ingestion are
    asynchronous)."""
    deadline = time.monotonic() + timeout_s
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        response = httpx.get(
            f"{phoenix}/v1/projects/default/spans/otlpv1", params={"trace_id": trace_id, "limit": 1000}, timeout=10
        )
        if response.status_code == 200:
            spans = response.json()["data"]
            if until(spans):
                return spans
        time.sleep(0.5)
    raise AssertionError(f"Phoenix did not show the expected spans of {trace_id} in {timeout_s} s: {spans}")


def _traced_env(monkeypatch: pytest.MonkeyPatch, phoenix: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{phoenix}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")


def test_a_corrected_request_reads_back_from_phoenix(phoenix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _traced_env(monkeypatch, phoenix)
    vllm = FakeUpstream(Chain(token_s=0.0, ttft_s=0.0))
    body = {
        "model": "chain-model",
        "stream": True,
        "messages": [{"role": "user", "content": f"chain n={N} seed={SEED} planted={PLANTED}"}],
    }
    with threaded_app(create_judge_app({"unfaithful": [planted_sentence(N, SEED, PLANTED)]})) as judge_url:
        judge = JudgeConfig(
            name="j", backend="anthropic", model="judge-model", base_url=judge_url, api_key="sk-test", max_retries=0
        )  # type: ignore[arg-type]
        app = create_app(Settings(upstream_url="http://vllm.test", judges=[judge]), upstream_transport=vllm.transport())
        with threaded_app(app) as url:
            response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert response.status_code == 200
    # the traceparent vLLM was sent names the trace
    sent = [r.headers["traceparent"] for r in vllm.requests if r.url.path == "/v1/chat/completions"]
    assert len(sent) >= 2  # the first round and the rewrite
    trace_id = sent[0].split("-")[1]
    (end,) = [f for f in frames(response.text) if '"finish_reason":"stop"' in f.replace(" ", "")]
    steps = json.loads(end)["faithfulness"]["steps"]
    labels = [label for label in map(_label, steps) if label]

    def complete(spans: list[dict[str, Any]]) -> bool:
        roots = [s for s in spans if not s["parent_span_id"]]
        return bool(roots) and len(spans) >= 1 + len(sent) and any(s.get("events") for s in roots)

    spans = _trace(phoenix, trace_id, complete)
    (root,) = [s for s in spans if not s["parent_span_id"]]
    assert root["name"] == "POST /v1/chat/completions"
    attributes = _attributes(root["attributes"])
    assert attributes["gen_ai.request.model"] == "chain-model" and attributes["faithproxy.mode"] == "correct"
    assert attributes["http.response.status_code"] == 200
    children = [s for s in spans if s is not root]
    assert children and all(s["parent_span_id"] == root["span_id"] for s in children)
    upstream = [s for s in children if _attributes(s["attributes"]).get("gen_ai.provider.name") == "vllm"]
    judges = [s for s in children if _attributes(s["attributes"]).get("gen_ai.provider.name") == "anthropic"]
    assert {f"00-{trace_id}-{s['span_id']}" for s in upstream} == {h.rsplit("-", 1)[0] for h in sent}
    assert judges and all(s["name"] == "chat judge-model" for s in judges)
    for span in judges:
        judged = _attributes(span["attributes"])
        assert judged["gen_ai.operation.name"] == "chat" and judged["gen_ai.request.model"] == "judge-model"
        assert judged["gen_ai.usage.input_tokens"] > 0 and judged["gen_ai.usage.output_tokens"] > 0
    first = _attributes(upstream[0]["attributes"]) if upstream else {}
    assert any("gen_ai.usage.output_tokens" in _attributes(s["attributes"]) for s in upstream), first
    # one evaluation event per checked step, in order, the planted step fixed with the judge's reason
    events = [e for e in root["events"] if e["name"] == EVALUATION]
    read = [_attributes(e["attributes"]) for e in events]
    assert [e["gen_ai.evaluation.score.label"] for e in read] == labels and labels.count("fixed") == 1
    assert all(e["gen_ai.evaluation.name"] == "faithfulness" for e in read)
    (fixed,) = [e for e in read if e["gen_ai.evaluation.score.label"] == "fixed"]
    assert fixed["faithproxy.step.index"] == PLANTED and fixed.get("gen_ai.evaluation.explanation")


def test_vllm_span_joins_the_proxy_trace(
    phoenix: str, fixture_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _require("vllm")
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    vllm_env = {  # vLLM's own exporter: OTLP/HTTP (its default is gRPC), exported within 0.2 s
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_SERVICE_NAME": "vllm",
    }
    server = start_vllm(
        fixture_model_dir,
        extra_args=["--otlp-traces-endpoint", f"{phoenix}/v1/traces"],
        log_path=tmp_path / "vllm.log",
        env=vllm_env,
        health_timeout=180,
    )
    try:
        _traced_env(monkeypatch, phoenix)
        settings = Settings(upstream_url=server.base_url, default_detector="none")
        with threaded_app(create_app(settings)) as url:
            response = httpx.post(
                f"{url}/v1/chat/completions",
                json={
                    "model": server.model,
                    "stream": True,
                    "max_tokens": 12,
                    "messages": [{"role": "user", "content": "Describe the picture."}],
                },
                timeout=120,
            )
            assert response.status_code == 200 and frames(response.text)[-1] == "[DONE]"
            request_id = response.headers["x-faithproxy-request-id"]
    finally:
        server.stop()  # vLLM's exporter flushes at exit

    def joined(spans: list[dict[str, Any]]) -> bool:
        return any(s["name"] == "llm_request" for s in spans) and any(not s["parent_span_id"] for s in spans)

    root_id = _root_trace(phoenix, request_id)
    spans = _trace(phoenix, root_id, joined, timeout_s=60)
    (root,) = [s for s in spans if not s["parent_span_id"]]
    upstream = [s for s in spans if _attributes(s["attributes"]).get("gen_ai.provider.name") == "vllm"]
    (engine,) = [s for s in spans if s["name"] == "llm_request"]
    assert len(upstream) == 1 and upstream[0]["parent_span_id"] == root["span_id"]
    assert engine["trace_id"] == root["trace_id"] == upstream[0]["trace_id"]
    assert engine["parent_span_id"] == upstream[0]["span_id"]  # vLLM's span is the proxy's call's child
    generated = _attributes(engine["attributes"])["gen_ai.usage.completion_tokens"]
    assert 1 <= generated <= 12  # the engine's own count of this request's tokens
    proxy_saw = _attributes(upstream[0]["attributes"]).get("gen_ai.usage.output_tokens")
    assert proxy_saw in (None, generated)  # the usage chunk, when vLLM sent one, says the same


def _root_trace(phoenix: str, request_id: str, timeout_s: float = 30.0) -> str:
    """The trace id of the proxy's SERVER span for `request_id` (its faithproxy.request_id attribute)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = httpx.get(
            f"{phoenix}/v1/projects/default/spans/otlpv1",
            params={"parent_id": "null", "limit": 1000, "attribute": f'faithproxy.request_id:"{request_id}"'},
            timeout=10,
        )
        if response.status_code == 200:
            for span in response.json()["data"]:
                if _attributes(span["attributes"]).get("faithproxy.request_id") == request_id:
                    return span["trace_id"]
        time.sleep(0.5)
    raise AssertionError(f"no root span for request {request_id} in Phoenix")
