"""The judge's bill is visible: per request in the `faithfulness` summary and the trace, per call in the
metrics; and a request's judge budget lets steps through unchecked (reason `budget`) without failing.

A real proxy (uvicorn) in front of a fake vLLM and the local judge server, both real on the wire."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import JudgeServerState
from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.observe.metrics import JUDGE_TOKEN_KINDS
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, frames, metric, running_app, threaded_app

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}]}


@dataclass
class Proxy:
    url: str
    judge: JudgeServerState
    trace_path: Path

    async def post(self, headers: dict[str, str] | None = None) -> httpx.Response:
        async with httpx.AsyncClient(timeout=15) as http:
            return await http.post(f"{self.url}/v1/chat/completions", json=BODY, headers=headers or {})

    async def metrics(self) -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{self.url}/metrics")).text

    def traces(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.trace_path.read_text().splitlines()]


@contextlib.asynccontextmanager
async def proxy(tmp_path: Path, **settings: Any) -> AsyncIterator[Proxy]:
    vllm = FakeUpstream()
    judge_app = create_judge_app({"unfaithful": []})
    with threaded_app(vllm) as vllm_url, threaded_app(judge_app) as judge_url:
        judge = JudgeConfig(
            name="j", backend="anthropic", model="judge-model", base_url=judge_url, api_key="sk-test", max_retries=0
        )  # type: ignore[arg-type]
        config = Settings(upstream_url=vllm_url, trace_path=str(tmp_path / "t.jsonl"), judges=[judge], **settings)
        async with running_app(create_app(config)) as url:
            yield Proxy(url, judge_app.state.judge, tmp_path / "t.jsonl")


async def test_the_bill_is_in_the_summary_the_trace_and_the_metrics(tmp_path: Path) -> None:
    async with proxy(tmp_path) as p:
        before = await p.metrics()
        response = await p.post()
        metrics = await p.metrics()
    assert response.status_code == 200
    for kind in JUDGE_TOKEN_KINDS:  # pre-initialised: the rates exist before the first call
        assert f'faithproxy_judge_tokens_total{{judge="j",kind="{kind}",policy="default"}} 0.0' in before
    assert 'faithproxy_judge_calls_total{judge="j"} 0.0' in before
    bill = response.json()["faithfulness"]["judge"]
    assert bill["calls"] == p.judge.requests >= 1
    assert bill["descriptions"] == 0 and bill["budget_steps"] == 0  # no image: nothing to describe
    assert bill["output_tokens"] == p.judge.tokens.output_tokens > 0
    assert bill["input_tokens"] == p.judge.tokens.input_tokens > 0
    assert bill["cached_input_tokens"] == p.judge.tokens.cached_input_tokens
    assert bill["cache_creation_tokens"] == p.judge.tokens.cache_creation_tokens > 0  # breakpoints were sent
    (trace,) = p.traces()
    assert trace["judge_usage"] == bill and trace["summary"]["judge"] == bill
    assert metric(metrics, "faithproxy_judge_calls_total", judge="j") == bill["calls"]
    for kind, field in JUDGE_TOKEN_KINDS.items():
        assert metric(metrics, "faithproxy_judge_tokens_total", judge="j", kind=kind) == bill[field]


async def test_the_bill_is_beside_usage_and_counted_by_key_policy(tmp_path: Path) -> None:
    """`faithproxy_judge_usage` beside `usage`: the body and a header of a non-streamed response, a
    stream's last chunk and its usage chunk; the metric labelled with the key policy's name."""
    policy = tmp_path / "policy.yaml"
    policy.write_text('keys:\n  - {name: app, key: "fp-app-key-123456"}\n')
    settings = {"policy_file": str(policy), "api_keys": ["fp-plain-key-654321"]}  # the plain key: default policy
    async with proxy(tmp_path, **settings) as p, httpx.AsyncClient(timeout=15) as http:
        url, auth = f"{p.url}/v1/chat/completions", {"authorization": "Bearer fp-app-key-123456"}
        whole = await http.post(url, json=BODY, headers=auth)
        calls_before_stream = p.judge.requests
        request = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
        streamed = await http.post(url, json=request, headers={"authorization": "Bearer fp-plain-key-654321"})
        metrics = await p.metrics()
    body = whole.json()
    bill = body["faithproxy_judge_usage"]
    assert set(bill) == {"calls", "input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens"}
    assert bill["calls"] == calls_before_stream >= 1 and bill["output_tokens"] > 0
    assert {k: body["faithfulness"]["judge"][k] for k in bill} == bill
    assert whole.headers["x-faithproxy-judge-usage"] == ", ".join(f"{k}={v}" for k, v in bill.items())
    chunks = [json.loads(data) for data in frames(streamed.text) if data != "[DONE]"]
    (end,) = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    usage_chunk = chunks[-1]
    assert usage_chunk["usage"] and usage_chunk["faithproxy_judge_usage"] == end["faithproxy_judge_usage"]
    stream_bill = end["faithproxy_judge_usage"]
    assert stream_bill["calls"] == p.judge.requests - calls_before_stream >= 1
    for kind, field in JUDGE_TOKEN_KINDS.items():
        assert metric(metrics, "faithproxy_judge_tokens_total", judge="j", kind=kind, policy="app") == bill[field]
        default = metric(metrics, "faithproxy_judge_tokens_total", judge="j", kind=kind, policy="default")
        assert default == stream_bill[field]


async def test_past_the_budget_perception_steps_pass_unchecked_and_the_request_succeeds(tmp_path: Path) -> None:
    async with proxy(tmp_path) as p:
        response = await p.post({"x-faithproxy-judge-budget": "0"})
        metrics = await p.metrics()
    assert response.status_code == 200 and p.judge.requests == 0
    summary = response.json()["faithfulness"]
    perception = [s for s in summary["steps"] if s["kind"] == "perception"]
    assert perception and all(s["unchecked_reason"] == "budget" and s["residual"] for s in perception)
    assert summary["judge"]["calls"] == 0 and summary["judge"]["budget_steps"] == len(perception)
    assert metric(metrics, "faithproxy_unchecked_steps_total", reason="budget") == len(perception)
    assert metric(metrics, "faithproxy_judge_calls_total", judge="j") == 0


async def test_the_server_budget_applies_and_a_request_may_only_lower_it(tmp_path: Path) -> None:
    async with proxy(tmp_path, judge_budget_tokens=0) as p:
        unchecked = await p.post()
        raised = await p.post({"x-faithproxy-judge-budget": "100"})
        bad = await p.post({"x-faithproxy-judge-budget": "lots"})
    assert unchecked.status_code == 200 and p.judge.requests == 0
    assert unchecked.json()["faithfulness"]["judge"]["budget_steps"] >= 1
    for refused in (raised, bad):
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "x-faithproxy-judge-budget" and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("value", ["-1", "1.5", "", "1e3", "0x10"])
async def test_bad_budget_headers_are_400s(tmp_path: Path, value: str) -> None:
    async with proxy(tmp_path) as p:
        response = await p.post({"x-faithproxy-judge-budget": value})
    assert response.status_code == 400 and "x-faithproxy-judge-budget" in response.json()["error"]["message"]


# Each door's request, and where its non-streamed body and its stream's last event put the bill.
DOOR_REQUESTS = {
    "/v1/completions": {"model": "m", "prompt": "What is in the image?", "max_tokens": 64},
    "/v1/responses": {"model": "m", "input": "What is in the image?", "max_output_tokens": 64},
    "/v1/messages": {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "What is in it?"}]},
}


def streamed_bill(path: str, text: str) -> dict[str, Any]:
    """The bill in a stream: on the finish chunk (completions), the response.completed event's response
    (responses), the message_delta event (messages)."""
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]  # named events too
    events = [json.loads(data) for data in lines if data != "[DONE]"]
    if path == "/v1/completions":
        (end,) = [e for e in events if e["choices"] and e["choices"][0].get("finish_reason")]
        return end["faithproxy_judge_usage"]
    if path == "/v1/responses":
        (end,) = [e for e in events if e["type"] in ("response.completed", "response.incomplete")]
        return end["response"]["faithproxy_judge_usage"]
    (end,) = [e for e in events if e["type"] == "message_delta"]
    return end["faithproxy_judge_usage"]


@pytest.mark.parametrize("path", DOOR_REQUESTS)
async def test_every_door_carries_the_bill_beside_usage(tmp_path: Path, path: str) -> None:
    async with proxy(tmp_path) as p, httpx.AsyncClient(timeout=15) as http:
        whole = await http.post(p.url + path, json=DOOR_REQUESTS[path])
        calls = p.judge.requests
        streamed = await http.post(p.url + path, json={**DOOR_REQUESTS[path], "stream": True})
    assert whole.status_code == streamed.status_code == 200, (whole.text, streamed.text)
    body = whole.json()
    bill = body["faithproxy_judge_usage"]
    assert bill["calls"] == calls >= 1 and bill["output_tokens"] > 0
    assert {k: body["faithfulness"]["judge"][k] for k in bill} == bill
    assert whole.headers["x-faithproxy-judge-usage"] == ", ".join(f"{k}={v}" for k, v in bill.items())
    assert streamed_bill(path, streamed.text)["calls"] == p.judge.requests - calls >= 1
    # each stream ends as its API's does: [DONE] on completions; the last event on the other two
    assert streamed.text.rstrip().endswith("data: [DONE]") == (path == "/v1/completions")
