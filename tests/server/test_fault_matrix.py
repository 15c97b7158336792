"""The fault matrix: vLLM, the judge and the client fail in every way we know, with real servers on
127.0.0.1 (a fake vLLM with fault modes and the local judge server, each in its own thread and event
loop, and the proxy in the test's loop, all real uvicorn).

In every case: no hang (each request has a deadline), no task of ours left running, a well-formed HTTP
error or a final error frame followed by `data: [DONE]`, the trace record written and the request
counted. (Real-vLLM versions of judge 500/garbage and client disconnect are in tests/integration;
MockTransport versions of the vLLM faults in test_upstream_faults.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
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
from faithproxy.server.observe.metrics import UPSTREAM_ERRORS
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, frames, metric, running_app, threaded_app

DEADLINE_S = 60  # each request's: it turns a hang into a failure (it bounds a wait, it measures nothing)
GUARD_S = 30.0  # the same for a wait on something the proxy does after its response (a trace, a task's end)
# The judge's timeout and vLLM's idle limit: a call or a silence a case expects to end gets a limit no loaded
# machine reaches (it bounds a hang, it measures nothing); only the cases whose fault is a hang or a stall
# (the call is never answered) get the short one, so those tests stay short.
ANSWERED_LIMIT_S = 10.0
HANG_LIMIT_S = 0.5
# A stall's idle limit also watches the frames the fake sends before it. A run in which a loaded machine held
# them up past the limit proves nothing about them: the case runs again with the limit doubled (the last
# run is checked whatever happened, so a proxy that loses them fails all the same).
STALL_LIMITS_S = (HANG_LIMIT_S, 1.0, 2.0, 4.0, 8.0)
BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}], "stream": True}
# Metric label of a stall: "stalled" once server/observe/metrics.py lists it, "other" until then.
STALLED = "stalled" if "stalled" in UPSTREAM_ERRORS else "other"


@dataclass
class Stack:
    proxy_url: str
    vllm: FakeUpstream
    judge: JudgeServerState
    trace_path: Path

    async def post(self, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            return await asyncio.wait_for(
                http.post(f"{self.proxy_url}/v1/chat/completions", json=body, headers=headers), DEADLINE_S
            )

    async def metrics(self) -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{self.proxy_url}/metrics")).text

    async def traces(self, count: int = 1) -> list[dict[str, Any]]:
        """The trace records once `count` are written (they are written after the last byte)."""
        lines: list[str] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(GUARD_S):
                while True:  # the file is appended to after the response: nothing to wait on but the file
                    lines = self.trace_path.read_text().splitlines() if self.trace_path.exists() else []
                    if len(lines) >= count:
                        return [json.loads(line) for line in lines]
                    await asyncio.sleep(0.02)
        raise AssertionError(f"{count} trace records expected, found {len(lines)}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def stack(
    tmp_path: Path, *, refuse: bool = False, judge_timeout_s: float = ANSWERED_LIMIT_S, idle_s: float = ANSWERED_LIMIT_S
) -> AsyncIterator[Stack]:
    vllm = FakeUpstream()
    judge_app = create_judge_app({"unfaithful": []})
    with (
        threaded_app(vllm, on_exit=vllm.release) as vllm_url,
        threaded_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url,
    ):
        judge = JudgeConfig(
            name="j",
            backend="anthropic",
            model="judge-model",
            base_url=judge_url,
            api_key="sk-test",  # type: ignore[arg-type]
            timeout_s=judge_timeout_s,
            max_retries=0,
        )
        settings = Settings(
            upstream_url=f"http://127.0.0.1:{free_port()}" if refuse else vllm_url,
            trace_path=str(tmp_path / "t.jsonl"),
            upstream_stream_idle_timeout_s=idle_s,
            judges=[judge],
            # the fault is on every call, and this matrix proves the error path: a break mid-stream is not
            # resumed here (resuming, with a fake that continues a chain: tests/server/test_resume.py)
            upstream_resume_attempts=0,
        )
        async with running_app(create_app(settings)) as proxy_url:
            yield Stack(proxy_url, vllm, judge_app.state.judge, tmp_path / "t.jsonl")


@contextlib.asynccontextmanager
async def no_leftover_tasks() -> AsyncIterator[None]:
    """Every task started inside the block finishes after it, by itself (servers' own tasks excluded: they
    started before); one still running after GUARD_S is a failure."""
    before = set(asyncio.all_tasks())
    yield
    current = asyncio.current_task()
    left: set[asyncio.Task[Any]] = set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(GUARD_S):
            while True:
                left = {t for t in asyncio.all_tasks() - before if not t.done() and t is not current}
                if not left:
                    return
                await asyncio.sleep(0.02)
    raise AssertionError(f"tasks left running: {[t.get_coro() for t in left]}")


def assert_error_frame_then_done(response: httpx.Response, code: str) -> dict[str, Any]:
    assert response.status_code == 200
    data = frames(response.text)
    assert data[-1] == "[DONE]", data[-3:]
    error = json.loads(data[-2])["error"]
    assert error["code"] == code
    return error


# ---- vLLM faults ------------------------------------------------------------------------------

NO_DETECTOR = {"x-faithproxy-detector": "none"}


@pytest.mark.parametrize(
    ("fault", "mode", "stream", "status", "code", "label"),
    [
        ("refused", "correct", True, 502, "connect", "connect"),
        ("refused", "off", True, 502, "connect", "connect"),
        ("http_500", "correct", True, 500, None, "status"),
        ("http_500", "off", False, 500, None, None),  # off mode passes vLLM's reply on as it is
        ("die_mid_stream", "correct", True, 200, "stream_broken", "stream_broken"),
        ("die_mid_stream", "correct", False, 502, "stream_broken", "stream_broken"),
        ("die_mid_stream", "detect", True, 200, "stream_broken", "stream_broken"),
        ("die_mid_stream", "off", True, 200, "stream_broken", "stream_broken"),
        ("stall_mid_stream", "correct", True, 200, "stalled", STALLED),
        ("stall_mid_stream", "correct", False, 502, "stalled", STALLED),
        ("stall_mid_stream", "off", True, 200, "stalled", STALLED),
        ("stall_before_headers", "correct", True, 502, "stalled", STALLED),
        ("stall_before_headers", "off", True, 502, "stalled", STALLED),
        ("malformed_sse", "correct", True, 200, "malformed", "malformed"),
        ("malformed_sse", "detect", True, 200, "malformed", "malformed"),
        ("malformed_sse", "correct", False, 502, "malformed", "malformed"),
    ],
)
async def test_vllm_faults(
    tmp_path: Path, fault: str, mode: str, stream: bool, status: int, code: str | None, label: str | None
) -> None:
    limits = STALL_LIMITS_S if fault.startswith("stall") else (ANSWERED_LIMIT_S,)
    for run, idle_s in enumerate(limits):
        run_path = tmp_path / str(run)
        run_path.mkdir()
        async with stack(run_path, refuse=fault == "refused", idle_s=idle_s) as s, no_leftover_tasks():
            s.vllm.fault = fault  # type: ignore[assignment]
            response = await s.post({**BODY, "stream": stream}, {**NO_DETECTOR, "x-faithproxy-mode": mode})
            (trace,) = await s.traces()
            metrics = await s.metrics()
        sent = sent_content(response) if status == 200 else ""
        # the first step the fake sends before its stall never reached the client: too slow a run (see above)
        if fault == "stall_mid_stream" and mode == "correct" and status == 200 and not sent and run < len(limits) - 1:
            continue
        break
    if status == 200:
        error = assert_error_frame_then_done(response, code or "")
        if mode == "correct":
            assert sent == "The image shows a red circle."  # whole steps only; the cut one is not sent
    else:
        assert response.status_code == status
        error = response.json()["error"]
        if code is not None:
            assert error["code"] == code
    if mode != "off" or status != 500:
        assert trace["error"].get("code") == error.get("code") and trace["error"]["message"] == error["message"]
    # a request that failed counts as 5xx, even when its stream had started with 200
    assert metric(metrics, "faithproxy_requests_total", mode=mode, status="5xx") == 1
    if label is not None:
        assert metric(metrics, "faithproxy_upstream_errors_total", reason=label) == 1
    if fault == "stall_mid_stream":
        await _until(lambda: s.vllm.aborted == 1)  # the proxy hung up: vLLM aborts the generation


def sent_content(response: httpx.Response) -> str:
    """The content a streamed response delivered before its error frame."""
    return "".join(
        (json.loads(d)["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for d in frames(response.text)[:-2]
        if "choices" in json.loads(d)
    )


async def _until(condition: Any) -> None:
    """Returns once `condition()` holds (the fake counts an abort in its own thread: nothing to wait on but
    the count); still false after GUARD_S is a failure."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(GUARD_S):
            while True:
                if condition():
                    return
                await asyncio.sleep(0.02)
    raise AssertionError("condition never became true")


@pytest.mark.parametrize("mode", ["correct", "off"])
async def test_a_slow_healthy_stream_outlives_the_idle_timeout(tmp_path: Path, mode: str) -> None:
    """The idle timeout bounds the silence between reads, not the stream: pauses of 0.1 s under an idle
    limit of 1 s, as many as make the stream last twice the limit at least (its own measured length shows
    it outlived the limit; a loaded machine only lengthens it). A run in which a loaded machine stretched a
    pause past the limit (the stream ended "stalled") runs again with the limit doubled and the stream
    with it; the last run is checked whatever happened, so a proxy that bounds the whole stream fails."""
    gap_s, limits = 0.1, (1.0, 2.0, 4.0, 8.0)
    for run, idle_s in enumerate(limits):
        repeats = round(2 * idle_s / gap_s)  # the stream: repeats + 1 pauses of gap_s
        run_path = tmp_path / str(run)
        run_path.mkdir()
        async with stack(run_path, idle_s=idle_s) as s, no_leftover_tasks():
            s.vllm.script = Sentences.repeating(repeats, gap_s=gap_s)
            started = asyncio.get_running_loop().time()
            response = await s.post(BODY, {**NO_DETECTOR, "x-faithproxy-mode": mode})
            lasted = asyncio.get_running_loop().time() - started
            (trace,) = await s.traces()
        data = frames(response.text)
        stalled = any(json.loads(d).get("error", {}).get("code") == "stalled" for d in data[:-1])
        if not (stalled and run < len(limits) - 1):
            break
    assert response.status_code == 200 and data[-1] == "[DONE]"
    assert not any("error" in json.loads(d) for d in data[:-1])
    assert response.text.count("It is on a white background.") == repeats and trace["error"] is None
    assert lasted > idle_s


# ---- judge faults -----------------------------------------------------------------------------

JUDGE_FAULTS = [("hang", "timeout"), ("500", "status_5xx"), ("429", "status_429"), ("garbage", "unparseable")]


@pytest.mark.parametrize(("judge_mode", "reason"), JUDGE_FAULTS)
async def test_judge_fault_with_pass_policy_delivers_unchecked(tmp_path: Path, judge_mode: str, reason: str) -> None:
    judge_timeout_s = HANG_LIMIT_S if judge_mode == "hang" else ANSWERED_LIMIT_S
    async with stack(tmp_path, judge_timeout_s=judge_timeout_s) as s, no_leftover_tasks():
        s.judge.mode = judge_mode  # type: ignore[assignment]
        response = await s.post(BODY, {"x-faithproxy-on-detector-error": "pass"})
        (trace,) = await s.traces()
        metrics = await s.metrics()
    data = frames(response.text)
    assert response.status_code == 200 and data[-1] == "[DONE]"
    assert not any("error" in json.loads(d) for d in data[:-1])
    summary = json.loads(data[-2])["faithfulness"]
    assert summary["perception_steps"] >= 1 and summary["residual"] == summary["perception_steps"]
    assert trace["error"] is None
    assert metric(metrics, "faithproxy_detector_errors_total", detector="judge", reason=reason) >= 1
    assert metric(metrics, "faithproxy_unchecked_steps_total", reason="detector_error") >= 1
    assert metric(metrics, "faithproxy_requests_total", mode="correct", status="2xx") == 1


@pytest.mark.parametrize(("judge_mode", "reason"), JUDGE_FAULTS)
@pytest.mark.parametrize("mode", ["correct", "detect"])
async def test_judge_fault_with_fail_policy_fails_the_request(
    tmp_path: Path, judge_mode: str, reason: str, mode: str
) -> None:
    judge_timeout_s = HANG_LIMIT_S if judge_mode == "hang" else ANSWERED_LIMIT_S
    async with stack(tmp_path, judge_timeout_s=judge_timeout_s) as s, no_leftover_tasks():
        s.judge.mode = judge_mode  # type: ignore[assignment]
        response = await s.post(BODY, {"x-faithproxy-on-detector-error": "fail", "x-faithproxy-mode": mode})
        (trace,) = await s.traces()
        metrics = await s.metrics()
    if mode == "correct":  # nothing is sent before the first check: an HTTP error
        assert response.status_code == 502
        error = response.json()["error"]
    else:  # detect mode streams text at once: the failure is the last frame
        error = assert_error_frame_then_done(response, reason)
    assert error["type"] == "detector_error"
    assert trace["error"]["type"] == "detector_error"
    assert metric(metrics, "faithproxy_detector_errors_total", detector="judge", reason=reason) == 1
    assert metric(metrics, "faithproxy_requests_total", mode=mode, status="5xx") == 1


# ---- client faults ----------------------------------------------------------------------------


async def test_client_disconnect_mid_stream(tmp_path: Path) -> None:
    # The stall is ended by the client leaving, not by the idle limit: a limit that a loaded machine's slow
    # hang-up could reach would end the stream first (an error frame, no disconnect).
    async with stack(tmp_path, idle_s=ANSWERED_LIMIT_S) as s, no_leftover_tasks():
        s.vllm.fault = "stall_mid_stream"
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            async with http.stream(
                "POST", f"{s.proxy_url}/v1/chat/completions", json=BODY, headers=NO_DETECTOR
            ) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        break  # the first step arrived: hang up while vLLM is still generating
        (trace,) = await s.traces()
        await _until(lambda: s.vllm.aborted == 1)
        metrics = await s.metrics()
    assert trace["disconnected"] is True
    assert metric(metrics, "faithproxy_client_disconnects_total") == 1
    assert metric(metrics, "faithproxy_requests_total", status="disconnected") == 1


async def test_slow_reader_gets_the_whole_stream(tmp_path: Path) -> None:
    """A client that reads a little at a time: the proxy waits on it (flow control) and delivers
    everything; nothing is dropped, nothing times out."""
    async with stack(tmp_path) as s, no_leftover_tasks():
        s.vllm.script = Sentences.repeating(400)
        url = httpx.URL(s.proxy_url)
        payload = json.dumps(BODY).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (url.host, url.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\n"
            + b"x-faithproxy-detector: none\r\nconnection: close\r\n"
            + f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        received = bytearray()
        async with asyncio.timeout(DEADLINE_S):
            while chunk := await reader.read(2048):
                received += chunk
                await asyncio.sleep(0.002)
        writer.close()
        (trace,) = await s.traces()
    text = received.decode()
    assert text.startswith("HTTP/1.1 200")
    assert text.count("It is on a white background.") == 400
    assert "data: [DONE]" in text[-64:]
    assert trace["error"] is None and trace["disconnected"] is False
