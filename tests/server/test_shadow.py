"""Shadow checks (server/shadow/checker.py): sampled off requests verified after the fact.

The proxy runs in process on 127.0.0.1 with the fake vLLM and the stand-in judge server (which calls the
first sentence of the fake's chain unfaithful). What is checked: the client of a sampled request gets
exactly the bytes of plain off mode; the shadow verdicts are detect mode's on the same chain and reach the
metrics (source shadow), the trace file and the report; a judge that fails is counted and loses nothing;
the queue and the token budget turn work away, counted, without touching the request.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.benchmarks.tinyvlm.processes import free_port
from faithproxy.clients.judges import JudgeConfig
from faithproxy.faithcore.correction import Delta, RoundEnd
from faithproxy.server.app import create_app
from faithproxy.server.doors.chat import chat_events
from faithproxy.server.doors.table import DOORS
from faithproxy.server.settings import Settings
from faithproxy.server.shadow.checker import ShadowCapture, TokenBucket
from faithproxy.testing import SENTENCES, FakeUpstream, metric, running_app

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}]}
STEPS = "faithproxy_perception_steps_total"
SAMPLED = "faithproxy_shadow_requests_total"


@contextlib.asynccontextmanager
async def proxy(tmp_path: Path, judge_url: str | None = None, **overrides: Any) -> AsyncIterator[Any]:
    """(http client, app state) of a proxy with a judge; the stand-in judge unless `judge_url`."""
    judge_app = create_judge_app({"unfaithful": [SENTENCES[0].strip()]})
    async with contextlib.AsyncExitStack() as stack:
        if judge_url is None:
            judge_url = await stack.enter_async_context(running_judge_server(judge_app))
        judge = JudgeConfig(name="claude", backend="anthropic", model="judge-model", base_url=judge_url,
                            api_key="sk-test", timeout_s=5, max_retries=0)  # type: ignore[arg-type]  # fmt: skip
        settings = Settings(upstream_url="http://vllm.test", trace_path=str(tmp_path / "t.jsonl"), judges=[judge],
                            max_retries=0, **overrides)  # fmt: skip
        app = create_app(settings, upstream_transport=FakeUpstream().transport())
        url = await stack.enter_async_context(running_app(app))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield http, app.state.faithproxy


def records(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_sampled_off_request_gets_off_s_bytes_and_detect_s_verdicts_after_the_fact(
    tmp_path: Path, stream: bool
) -> None:
    # max_batch_steps=1: the detect request checks each step on its own, as the replay does (live detect
    # batches the steps that finished while the judge was busy: with this fake, all of them at once)
    async with proxy(tmp_path, shadow_share=1.0, max_batch_steps=1) as (http, state):
        body = {**BODY, "stream": stream}
        plain = await http.post("/v1/chat/completions", json=body, headers={"x-faithproxy-mode": "off"})
        await state.shadow.drained()
        # the same request without sampling: the bytes vLLM sent, which off mode passes on
        state.settings.shadow_share = 0.0
        unsampled = await http.post("/v1/chat/completions", json=body, headers={"x-faithproxy-mode": "off"})
        detect = await http.post("/v1/chat/completions", json=body, headers={"x-faithproxy-mode": "detect"})
        text = (await http.get("/metrics")).text
        report = (await http.get(f"/v1/faithfulness/{plain.headers['x-faithproxy-request-id']}")).json()
    assert plain.content.replace(b"\n", b"") and _unid(plain.content) == _unid(unsampled.content)
    assert metric(text, SAMPLED, outcome="checked") == 1 and metric(text, SAMPLED, outcome="not_sampled") == 1
    for verdict in ("faithful", "unfaithful", "unknown"):
        shadow = metric(text, STEPS, source="shadow", verdict=verdict, endpoint="/v1/chat/completions")
        inline = metric(text, STEPS, source="inline", verdict=verdict, endpoint="/v1/chat/completions")
        assert shadow == inline, verdict
    assert metric(text, STEPS, source="shadow", verdict="unfaithful") == 1  # the judge's one flag
    assert detect.status_code == 200
    assert report["source"] == "shadow" and report["faithfulness"]["unfaithful_detected"] == 1
    shadow_records = [r for r in records(tmp_path) if r["source"] == "shadow"]
    assert len(shadow_records) == 1 and shadow_records[0]["id"] == plain.headers["x-faithproxy-request-id"]
    assert [s["detected"] for s in shadow_records[0]["steps"] if s["kind"] == "perception"][0] == "unfaithful"


def _unid(content: bytes) -> bytes:
    """A response without what differs per request: the fake's ids and times are per request."""
    out = []
    for line in content.split(b"\n"):
        try:
            data = json.loads(line.removeprefix(b"data: "))
        except ValueError:
            out.append(line)
            continue
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k not in ("id", "created")}
        out.append(json.dumps(data).encode())
    return b"\n".join(out)


async def test_a_judge_that_fails_is_counted_and_the_check_still_leaves_its_record(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with proxy(tmp_path, judge_url=down, shadow_share=1.0) as (http, state):
        response = await http.post("/v1/chat/completions", json=BODY, headers={"x-faithproxy-mode": "off"})
        await state.shadow.drained()
        text = (await http.get("/metrics")).text
    assert response.status_code == 200
    assert metric(text, "faithproxy_detector_errors_total", detector="judge") >= 1
    assert metric(text, STEPS, source="shadow", verdict="unknown") >= 1
    assert metric(text, STEPS, source="shadow", verdict="unfaithful") == 0
    assert [r["source"] for r in records(tmp_path)] == ["inline", "shadow"]


async def test_what_the_queue_or_the_budget_cannot_take_is_counted_and_never_checked(tmp_path: Path) -> None:
    async with proxy(tmp_path, shadow_share=1.0, shadow_queue=1, shadow_concurrency=1) as (http, state):
        checker = state.shadow
        checker.budget = TokenBucket(0)  # spent
        await http.post("/v1/chat/completions", json=BODY, headers={"x-faithproxy-mode": "off"})
        checker.budget = TokenBucket(None)
        admitted = []
        original = checker.submit

        def hold(a: Any, capture: Any, *, complete: bool) -> None:  # the next submits land before any check runs
            admitted.append((a, capture, complete))

        checker.submit = hold
        for _ in range(3):
            await http.post("/v1/chat/completions", json=BODY, headers={"x-faithproxy-mode": "off"})
        for a, capture, complete in admitted:
            original(a, capture, complete=complete)
        await checker.drained()
        text = (await http.get("/metrics")).text
    assert metric(text, SAMPLED, outcome="over_budget") == 1
    assert metric(text, SAMPLED, outcome="queue_full") == 2
    assert metric(text, SAMPLED, outcome="checked") == 1
    assert metric(text, "faithproxy_shadow_queue_depth") == 0
    assert [r["source"] for r in records(tmp_path)].count("shadow") == 1


def test_a_capture_past_its_bound_holds_nothing_and_a_replayed_round_drops_usage() -> None:
    capture = ShadowCapture(limit=8)
    capture.add(b"12345")
    capture.add(b"6789")
    assert capture.overflow and capture.data() == b""
    sse = b'data: {"choices":[{"delta":{"content":"A."}}],"usage":{"total_tokens":9}}\n\ndata: [DONE]\n\n'
    assert chat_events(sse, True) == [Delta("content", "A."), RoundEnd(None, None, None)]
    assert chat_events(b"not json", False) is None
    assert all(door.shadow_reader is not None for door in DOORS)  # every door of the product can be checked


def test_the_budget_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(60, clock=lambda: now[0])
    bucket.spend(90)  # one check may overdraw it
    assert not bucket.available()
    now[0] += 30.0  # +30 tokens: still 0 left
    assert not bucket.available()
    now[0] += 1.0
    assert bucket.available()
