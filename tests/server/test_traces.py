"""Trace lines from concurrent writers never interleave; the one writer counts and records a request."""

import json
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from faithproxy.faithcore.errors import UpstreamError, UpstreamErrorCode
from faithproxy.server.admission.admit import Admitted
from faithproxy.server.admission.policy import RequestPolicy
from faithproxy.server.observe.finish import finish_request
from faithproxy.server.observe.metrics import Metrics
from faithproxy.server.observe.traces import TRACE_SCHEMA_VERSION, RequestTrace, TraceWriter
from faithproxy.testing import metric


def test_concurrent_writers_produce_whole_lines(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "sub" / "t.jsonl")
    payload = "x" * 20_000  # larger than one write buffer

    def write(n: int) -> None:
        for i in range(50):
            writer.write({"id": f"{n}-{i}", "prompt": payload})

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = [json.loads(line) for line in (tmp_path / "sub" / "t.jsonl").read_text().splitlines()]
    assert len(records) == 400
    assert {r["id"] for r in records} == {f"{n}-{i}" for n in range(8) for i in range(50)}
    assert all(r["version"] == TRACE_SCHEMA_VERSION and r["prompt"] == payload for r in records)


def test_no_path_writes_nothing(tmp_path: Path) -> None:
    TraceWriter(None).write({"id": "x"})
    assert list(tmp_path.iterdir()) == []


def _admitted(mode: str) -> Admitted:
    policy = RequestPolicy(
        mode=mode, detector="none", max_retries=0, judge=None, on_detector_error="pass", annotate=True
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    return Admitted(body, b"{}", policy, "ab" * 12, time.perf_counter(), 1700000000.0)


def test_finish_request_counts_and_writes_one_record(tmp_path: Path) -> None:
    """The one writer both doors use: an upstream error sets the status class and its reason is counted;
    a request without a session has the session's fields empty."""
    metrics = Metrics(CollectorRegistry(), ["none"])
    error = UpstreamError("upstream stream ended without [DONE]", code=UpstreamErrorCode.STREAM_TRUNCATED)
    finish_request(RequestTrace(_admitted("off"), ttft=0.25, error=error), metrics, TraceWriter(tmp_path / "t.jsonl"))
    finish_request(RequestTrace(_admitted("detect"), disconnected=True), metrics, TraceWriter(None))
    (record,) = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert list(record) == [
        *("version", "id", "time", "model", "mode", "source", "detector", "judge", "stream", "prompt", "images"),
        "steps",
        *("answer", "reasoning", "summary", "usage", "judge_usage", "timings", "hints", "disconnected", "error"),
    ]
    assert (record["id"], record["time"], record["mode"], record["stream"]) == ("ab" * 12, 1700000000.0, "off", True)
    assert (record["prompt"], record["images"], record["steps"], record["usage"]) == (None, [], [], None)
    assert record["timings"]["ttft_s"] == 0.25 and record["timings"]["verification_s"] == 0.0
    assert record["error"]["code"] == "stream_truncated" and record["disconnected"] is False
    exposition = generate_latest(metrics.registry).decode()
    assert metric(exposition, "faithproxy_requests_total", mode="off", status="5xx") == 1
    assert metric(exposition, "faithproxy_requests_total", mode="detect", status="disconnected") == 1
    assert metric(exposition, "faithproxy_upstream_errors_total", reason="stream_truncated") == 1
    assert metric(exposition, "faithproxy_request_duration_seconds_count", mode="off", stream="true") == 1
