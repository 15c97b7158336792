"""No work for a client that left (issue 33, server/admission/client_gone.py): a request whose client hangs up
before the answer is complete is cancelled in every mode, streamed or not: the upstream stream is
closed (vLLM would abort it), the slot is free, the trace record is written and the request counted.

Before, a non-streamed request ran to its end for nobody: in the 30-minute soak, clients that gave up
left more requests in flight than there were clients.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from faithproxy.server.admission.connections import HTTP_PROTOCOL
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, metric, running_app
from tests.support import read_traces

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
# (mode, stream): off streams only (a non-streamed off request has no stream upstream to stall)
CASES = [("correct", False), ("detect", False), ("correct", True), ("off", True)]


async def _hang_up_after(url: str, mode: str, stream: bool, seconds: float) -> None:
    """Sends the request over a raw socket and closes it after `seconds`, answer or not."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    raw = json.dumps(BODY | {"stream": stream}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        f"x-faithproxy-mode: {mode}\r\nx-faithproxy-detector: none\r\ncontent-length: {len(raw)}\r\n\r\n"
    )
    writer.write(head.encode() + raw)
    await writer.drain()
    await asyncio.sleep(seconds)
    writer.close()


async def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not within the time"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(("mode", "stream"), CASES)
async def test_a_client_that_hangs_up_cancels_its_request(mode: str, stream: bool, tmp_path: Path) -> None:
    # the upstream sends two frames, then nothing until the proxy goes: only cancelling ends it
    vllm = FakeUpstream(fault="stall_mid_stream")
    settings = Settings(
        upstream_url="http://vllm.test", trace_path=str(tmp_path / "traces.jsonl"), upstream_stream_idle_timeout_s=120
    )
    app = create_app(settings, upstream_transport=vllm.transport())
    try:
        async with running_app(app, http=HTTP_PROTOCOL) as url, httpx.AsyncClient(base_url=url) as http:
            await _hang_up_after(url, mode, stream, 0.5)
            await _until(lambda: vllm.aborted == 1)  # the proxy closed its upstream stream
            exposition = (await http.get("/metrics")).text
            assert metric(exposition, "faithproxy_requests_in_flight") == 0
            assert metric(exposition, "faithproxy_abandoned_requests_total") == 1
            ok = await http.post("/v1/chat/completions", json=BODY, headers={"x-faithproxy-mode": "off"})
            assert ok.status_code == 200  # the slot is free; the connection's end did not wedge anything
    finally:
        vllm.release()
    traces = read_traces(tmp_path / "traces.jsonl")
    assert [(t["mode"], t["stream"]) for t in traces][:1] == [(mode, stream)]  # the abandoned request's record


async def test_an_answer_sent_whole_is_not_counted_as_abandoned() -> None:
    vllm = FakeUpstream()
    app = create_app(Settings(upstream_url="http://vllm.test"), upstream_transport=vllm.transport())
    async with running_app(app, http=HTTP_PROTOCOL) as url, httpx.AsyncClient(base_url=url) as http:
        for mode in ("off", "correct"):
            for stream in (False, True):
                headers = {"x-faithproxy-mode": mode, "x-faithproxy-detector": "none"}
                response = await http.post("/v1/chat/completions", json=BODY | {"stream": stream}, headers=headers)
                assert response.status_code == 200
        exposition = (await http.get("/metrics")).text
    assert metric(exposition, "faithproxy_abandoned_requests_total") == 0
    assert "faithproxy_abandoned_requests_total 0.0" in exposition
    assert vllm.aborted == 0


async def test_a_detect_stream_left_at_once_leaves_no_task_pending() -> None:
    """Clients that hang up 0 to 50 ms after sending a detect-mode stream: the session's helper tasks
    (reader, checker) are all cancelled and finished, none left for the garbage collector to destroy
    "pending" (before the fix, about one request in five: starlette's cancelled scope cut the session's
    cleanup short after its first await)."""
    loop = asyncio.get_running_loop()
    destroyed: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: destroyed.append(str(context.get("message"))))
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nx-faithproxy-mode: detect\r\n"
        f"x-faithproxy-detector: none\r\ncontent-length: {len(raw)}\r\n\r\n"
    ).encode()
    app = create_app(Settings(upstream_url="http://vllm.test"), upstream_transport=FakeUpstream().transport())
    try:
        async with running_app(app, http=HTTP_PROTOCOL) as url:
            host, port = url.removeprefix("http://").split(":")
            for delay in [0, 0.001, 0.003, 0.01, 0.02, 0.05] * 6:
                _, writer = await asyncio.open_connection(host, int(port))
                writer.write(head + raw)
                await writer.drain()
                await asyncio.sleep(delay)
                writer.transport.abort()
            await asyncio.sleep(1.5)  # the proxy notices the hang-ups and cleans up
            gc.collect()
            await asyncio.sleep(0.2)
    finally:
        loop.set_exception_handler(previous)
    assert [m for m in destroyed if "destroyed but it is pending" in m] == []
