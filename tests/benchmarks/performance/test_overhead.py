"""The overhead benchmark end to end, small and bounded: real upstream and faithproxy processes, no
LiteLLM. Checks that the figures are well-formed, never how fast anything was."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from faithproxy.benchmarks.performance.overhead import pct
from faithproxy.benchmarks.performance.overhead_client import (
    _ticks_cpu,
    cpu_seconds,
    make_client,
    request_body,
    stream_once,
)
from faithproxy.testing import Counted, FakeUpstream, expected_text, running_app

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def test_percentiles_interpolate() -> None:
    assert pct([], 50) is None
    assert pct([3.0], 99) == 3.0
    assert pct([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert pct(list(range(101)), 99) == 99


# Spins for the CPU seconds it reads on each line of stdin, answering each with an empty line.
_SPINNER = """
import sys, time
for line in sys.stdin:
    start = time.thread_time()
    while time.thread_time() - start < float(line):
        pass
    print(flush=True)
"""


def test_cpu_seconds_reads_a_short_burst_to_below_a_tick() -> None:
    # /proc's tick counts (10 ms) read 0.0 for a proxy's short window on a fast machine (CI once did);
    # the CPU clock sees a 5 ms burst, and agrees with the ticks once they have something to count.
    with subprocess.Popen(
        [sys.executable, "-c", _SPINNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdin is not None and child.stdout is not None

        def spin(seconds: float) -> None:
            child.stdin.write(f"{seconds}\n")
            child.stdin.flush()
            child.stdout.readline()

        try:
            before = cpu_seconds(child.pid)
            spin(0.005)
            assert cpu_seconds(child.pid) - before >= 0.005
            spin(0.3)
            assert abs(cpu_seconds(child.pid) - _ticks_cpu(child.pid)) < 0.05
        finally:
            child.kill()


async def test_fast_upstream_streams_the_expected_text_and_holds() -> None:
    async with running_app(FakeUpstream(Counted(default_chunks=3))) as url:
        client = make_client(url, 8)
        try:
            result = await stream_once(client, request_body(stream=True, chunks=5), 5)
            assert result.ok, result.error
            assert result.ttft_s is not None and result.ttft_s <= result.total_s

            plain = await client.post("/v1/chat/completions", content=request_body(stream=False, chunks=4))
            assert plain.json()["choices"][0]["message"]["content"] == expected_text(4)

            # A held stream waits after its first content chunk until released.
            await client.post("/bench/arm")
            opened = asyncio.Event()
            task = asyncio.create_task(
                stream_once(client, request_body(stream=True, chunks=3, hold=True), 3, opened.set)
            )
            await asyncio.wait_for(opened.wait(), 10)
            await asyncio.sleep(0.1)
            assert not task.done()
            assert (await client.post("/bench/release")).json() == {"released": 1}
            assert (await task).ok
            assert (await stream_once(client, request_body(stream=True, chunks=3, hold=True), 3)).ok  # disarmed
        finally:
            await client.aclose()


async def test_wrong_content_is_an_error_not_a_result() -> None:
    async def frames() -> AsyncIterator[bytes]:
        yield b'data: {"choices":[{"delta":{"content":"nope"}}]}\n\ndata: [DONE]\n\n'

    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=frames())
    )

    async with httpx.AsyncClient(base_url="http://upstream", transport=transport) as client:
        result = await stream_once(client, request_body(stream=True, chunks=2), 2)
    assert result.error == "content differs from what the upstream sent"


def test_overhead_script_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    argv = [
        sys.executable,
        "-m",
        "faithproxy.benchmarks.performance.overhead",
        "--no-litellm",
        "--requests",
        "20",
        "--windows",
        "1",
    ]
    argv += ["--rps-requests", "40", "--concurrency", "8", "--hold", "20", "--streams", "50"]
    argv += ["--stream-chunks", "5", "--stream-delay-ms", "20", "--workdir", str(tmp_path / "work")]
    argv += ["--json", str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "concurrent streams via faithproxy: 0 errors" in proc.stdout

    report = json.loads(out.read_text())
    latency = report["latency"]
    assert set(latency) == {"direct", "faithproxy"}
    for figures in latency.values():
        for kind in ("stream", "non_stream"):
            assert figures[kind]["requests"] == 20
            assert figures[kind]["errors"] == 0
            assert figures[kind]["total_p50_ms"] <= figures[kind]["total_p99_ms"]
        assert 0 < figures["stream"]["ttft_p50_ms"] <= figures["stream"]["ttft_p99_ms"]
    assert set(latency["faithproxy"]["added"]) >= {"stream_ttft_p50_ms", "non_stream_total_p99_ms"}

    for figures in report["throughput"].values():
        assert figures["requests"] == 40 and figures["errors"] == 0 and figures["rps_median"] > 0
    assert report["throughput"]["faithproxy"]["proxy_cpu_ms_per_request"] > 0

    memory = report["memory"]["faithproxy"]
    assert memory["streams_open"] == 20 and memory["errors"] == 0
    assert memory["open_rss_mib"] > 0 and memory["idle_rss_mib"] > 0

    load = report["load"]["faithproxy"]
    assert load["requests"] == load["completed"] == 50 and load["errors"] == 0
    assert load["ttft_p50_ms"] <= load["ttft_p99_ms"] and load["total_p50_ms"] <= load["total_p99_ms"]
    assert load["open_at_once"] == 50 and load["all_opened"] is True
    assert report["goals"]["load_zero_errors"] is True
    assert report["config"]["litellm"] is None
