"""Resume after an upstream break, end to end through the app, against a fake vLLM that breaks chosen calls.

The fake's chain is fixed text; a continuation (an assistant message last, continue_final_message) gets
exactly the rest of it after the partial message, as vLLM would continue it. Its faults: the first
calls of a request die mid-stream (the connection drops after some frames), or stall there. The client
must see one uninterrupted stream, every call of the request must go to the same URL with the same
routing key, and the resumes must be counted and in the trace. Off mode keeps the error frame.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, frames, metric, running_app, threaded_app
from faithproxy.testing.answer import Answer, Reset, Stall, Step
from faithproxy.testing.wire import DONE, delta, event, usage_chunk

SENTENCES = ["The image shows a red circle. ", "It is on a white background. ", "It is small. ", "So it is red."]
FULL = "".join(SENTENCES)
BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}], "stream": True}
NONE = {"x-faithproxy-detector": "none"}
PIECE = 6  # characters per delta: a break falls inside a sentence
# A call or a silence expected to end gets a limit no loaded machine reaches (it bounds a hang, it measures
# nothing); only a stall, which never ends by itself, is left to a short idle limit.
ANSWERED_S = 30.0
STALL_LIMIT_S = 0.3


class BreakingUpstream(FakeUpstream):
    """Streams FULL (or the rest of it after a continuation's partial message) in PIECE-character deltas;
    the first `breaks` streamed calls die (or stall) after `after` deltas."""

    def __init__(self, breaks: int, *, after: int = 9, how: str = "reset") -> None:
        super().__init__()
        self.breaks, self.after, self.how = breaks, after, how
        self.streams: list[dict[str, Any]] = []
        self.on_break: Callable[[], None] = lambda: None  # called as a breaking answer is handed out

    def chat(self, body: dict[str, Any]) -> Answer:
        self.streams.append(body)
        last = body["messages"][-1]
        written = last["content"] if body.get("continue_final_message") else ""
        assert FULL.startswith(written), f"a continuation of text the chain never had: {written!r}"
        rest = FULL[len(written) :]
        frames_: list[Step] = [event(delta(rest[i : i + PIECE])) for i in range(0, len(rest), PIECE)]
        if len(self.streams) <= self.breaks:
            self.on_break()
            return Answer.stream((*frames_[: self.after], Reset() if self.how == "reset" else Stall()))
        last_frame = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        usage = event(usage_chunk(prompt_tokens=7, completion_tokens=-(-len(rest) // PIECE)))
        return Answer.stream((*frames_, last_frame, usage, DONE))


@contextlib.asynccontextmanager
async def proxy(
    vllm: FakeUpstream, tmp_path: Path, *, served: bool = False, **settings: Any
) -> AsyncIterator[tuple[str, Path, FastAPI]]:
    """The proxy in front of `vllm`: in process (MockTransport), or `served` on 127.0.0.1 (uvicorn in its
    own thread) where the proxy's own HTTP client and its idle limit are what reads it. Gives the proxy's
    URL, its trace file and its app."""
    trace = tmp_path / "t.jsonl"
    with contextlib.ExitStack() as stack:
        upstream_url, transport = "http://vllm.test", vllm.transport()
        if served:
            upstream_url, transport = stack.enter_context(threaded_app(vllm, on_exit=vllm.release)), None
        config = Settings(upstream_url=upstream_url, trace_path=str(trace), **settings)
        app = create_app(config, upstream_transport=transport)
        async with running_app(app) as url:
            yield url, trace, app


async def post(
    url: str, trace: Path, headers: dict[str, str], body: dict[str, Any] | None = None
) -> tuple[httpx.Response, dict[str, Any], str]:
    async with httpx.AsyncClient(timeout=ANSWERED_S) as http:
        response = await http.post(f"{url}/v1/chat/completions", json=body or BODY, headers=headers)
        metrics = (await http.get(f"{url}/metrics")).text
    (record,) = [json.loads(line) for line in trace.read_text().splitlines()]  # noqa: ASYNC240 - a small file
    return response, record, metrics


def content_of(response: httpx.Response) -> tuple[str, list[str]]:
    """The content the client got, and the error codes of any error frames."""
    text, errors = "", []
    for data in frames(response.text)[:-1]:
        chunk = json.loads(data)
        if "error" in chunk:
            errors.append(chunk["error"]["code"])
        for choice in chunk.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    return text, errors


@pytest.mark.parametrize("mode", ["correct", "detect"])
async def test_a_stream_that_dies_mid_way_is_resumed_and_the_client_sees_one_stream(tmp_path: Path, mode: str) -> None:
    vllm = BreakingUpstream(breaks=1)
    async with proxy(vllm, tmp_path) as (url, trace, _):
        response, record, metrics = await post(url, trace, {**NONE, "x-faithproxy-mode": mode})
    text, errors = content_of(response)
    assert response.status_code == 200 and frames(response.text)[-1] == "[DONE]"
    assert errors == [] and text == FULL  # nothing lost, nothing twice
    first, second = vllm.streams
    partial = second["messages"][-1]["content"]
    if mode == "correct":  # from the last verified step: the cut sentence is written again
        assert partial == "The image shows a red circle."
    else:  # from exactly the text the client already has
        assert partial == FULL[: 9 * PIECE]
    assert second["continue_final_message"] is True and first["messages"] == second["messages"][:-1]
    assert metric(metrics, "faithproxy_upstream_resumes_total", outcome="resumed") == 1
    assert metric(metrics, "faithproxy_upstream_resumes_total", outcome="exhausted") == 0
    assert metric(metrics, "faithproxy_upstream_errors_total", reason="stream_broken") == 0  # the client saw none
    assert record["error"] is None and record["summary"]["rounds"] == 2 and record["summary"]["resumes"] == 1
    # usage adds up: the broken round's tokens estimated at one per delta, then the resumed round's count
    rest = len(FULL) - len(partial)
    assert record["usage"]["completion_tokens"] == 9 + -(-rest // PIECE)
    # one URL, one routing key for both calls
    calls = [r for r in vllm.requests if r.url.path == "/v1/chat/completions"]
    assert {r.url.host for r in calls} == {"vllm.test"}
    keys = {r.headers.get("x-session-id") for r in calls}
    assert len(keys) == 1 and None not in keys


async def test_a_stall_past_the_idle_limit_is_resumed(tmp_path: Path) -> None:
    """The stall never ends by itself, so a short idle limit ends it. The resumed stream must pass, so its
    limit is one no loaded machine reaches: the generator reads its idle limit at each call it opens, and
    the fake raises it as it hands out the stall (before the proxy can open the resuming call). A machine
    so slow that the short limit cut the stalled call before its first frames changes nothing checked
    here: that call is cut by the limit all the same, and the resumed one writes the whole chain."""
    vllm = BreakingUpstream(breaks=1, how="stall")
    async with proxy(vllm, tmp_path, served=True, upstream_stream_idle_timeout_s=STALL_LIMIT_S) as (url, trace, app):
        generator = app.state.faithproxy.generator
        vllm.on_break = lambda: setattr(generator, "_stream_idle_timeout_s", ANSWERED_S)
        response, record, metrics = await post(url, trace, NONE)
    text, errors = content_of(response)
    assert errors == [] and text == FULL and len(vllm.streams) == 2
    assert metric(metrics, "faithproxy_upstream_resumes_total", outcome="resumed") == 1
    assert vllm.aborted == 1  # the stalled stream was closed: vLLM aborts its generation


async def test_when_the_attempts_run_out_the_error_frame_ends_the_stream(tmp_path: Path) -> None:
    vllm = BreakingUpstream(breaks=10)
    async with proxy(vllm, tmp_path, upstream_resume_attempts=2) as (url, trace, _):
        response, record, metrics = await post(url, trace, NONE)
    text, errors = content_of(response)
    assert errors == ["stream_broken"] and frames(response.text)[-1] == "[DONE]"
    assert FULL.startswith(text) and text  # verified steps only, each once
    assert len(vllm.streams) == 3  # the first round and two resumes
    assert metric(metrics, "faithproxy_upstream_resumes_total", outcome="resumed") == 2
    assert metric(metrics, "faithproxy_upstream_resumes_total", outcome="exhausted") == 1
    assert metric(metrics, "faithproxy_upstream_errors_total", reason="stream_broken") == 1
    assert record["error"]["code"] == "stream_broken" and record["summary"] is not None


async def test_off_mode_cannot_resume_bytes_it_forwarded_it_ends_with_the_error_frame(tmp_path: Path) -> None:
    vllm = BreakingUpstream(breaks=1)
    async with proxy(vllm, tmp_path) as (url, trace, _):
        response, record, metrics = await post(url, trace, {"x-faithproxy-mode": "off", "x-session-id": "conv-7"})
    text, errors = content_of(response)
    assert errors == ["stream_broken"] and frames(response.text)[-1] == "[DONE]"
    assert text == FULL[: 9 * PIECE] and len(vllm.streams) == 1
    assert metric(metrics, "faithproxy_upstream_resumes_total", outcome="resumed") == 0
    (call,) = [r for r in vllm.requests if r.url.path == "/v1/chat/completions"]
    assert call.headers["x-session-id"] == "conv-7"  # the routing key passes through off mode too
