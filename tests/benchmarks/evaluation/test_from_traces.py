"""Traces written by the real proxy app (scripted vLLM underneath, the local judge on the wire) convert
to labelled chains and back without losing anything."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.evaluation.from_traces import TraceFormatError, chain_of_trace, chains_from_traces, trace_of
from faithproxy.benchmarks.evaluation.labelled import iter_chains, write_chains
from faithproxy.benchmarks.evaluation.metrics import upr
from faithproxy.benchmarks.standins.judge_server import create_app as judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.server.app import create_app
from faithproxy.testing import running_app
from tests.support import local_judge_settings

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n-not-really-an-image").decode()
FIRST = ["The image shows a car. ", "The car is blue. ", "So the answer is B."]
AFTER_FIX = [" So the answer is A."]
ORACLE = {"unfaithful": ["The car is blue."], "reasoning": ["So the answer is B.", "So the answer is A."]}


def _sse(texts: list[str]) -> bytes:
    chunks = [{"id": "u", "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]} for t in texts]
    chunks.append({"id": "u", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({"id": "u", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": len(texts)}})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def vllm(request: httpx.Request) -> httpx.Response:
    """A scripted vLLM: the chain above; a continuation after the fix; "[The car is red.]" on regeneration."""
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
    body = json.loads(request.content)
    if body.get("stream"):
        texts = AFTER_FIX if body.get("continue_final_message") else FIRST
        return httpx.Response(200, content=_sse(texts), headers={"content-type": "text/event-stream"})
    message = {"role": "assistant", "content": "[The car is red.]"}
    return httpx.Response(
        200,
        json={
            "id": "r",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
        },
    )


def _body(stream: bool) -> dict[str, Any]:
    content = [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "text", "text": "What colour is the car? A. red B. blue"},
    ]
    return {"model": "m", "messages": [{"role": "user", "content": content}], "stream": stream}


@pytest.fixture
async def trace_file(tmp_path: Path) -> Path:
    """Four requests through the real app: correct (stream), detect, none detector, off mode."""
    trace = tmp_path / "traces.jsonl"
    async with running_judge_server(judge_app(ORACLE)) as judge_url:
        settings = local_judge_settings("http://vllm.test", judge_url, trace_path=str(trace))
        app = create_app(settings, upstream_transport=httpx.MockTransport(vllm))
        async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            for stream, headers in [
                (True, {"x-faithproxy-mode": "correct"}),
                (False, {"x-faithproxy-mode": "detect", "x-faithproxy-judge": "qwen"}),
                (False, {"x-faithproxy-detector": "none"}),
                (False, {"x-faithproxy-mode": "off"}),
            ]:
                response = await http.post("/v1/chat/completions", json=_body(stream), headers=headers)
                assert response.status_code == 200, response.text
    return trace


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_real_traces_convert_losslessly(trace_file: Path, tmp_path: Path) -> None:
    records = _records(trace_file)
    assert [r["mode"] for r in records] == ["correct", "detect", "correct", "off"]
    for view in ("delivered", "original"):
        chains = chains_from_traces([trace_file], view=view)
        out = tmp_path / f"{view}.jsonl"
        write_chains(out, chains)
        again = list(iter_chains(out.read_text().splitlines()))
        assert [trace_of(c) for c in again] == records


async def test_delivered_and_original_views(trace_file: Path) -> None:
    correct, detect, unchecked, off = chains_from_traces([trace_file])
    sha = hashlib.sha256(base64.b64decode(PNG)).hexdigest()
    assert correct.image == sha and correct.question == "What colour is the car? A. red B. blue"
    assert correct.gold_answer is None and correct.extra["images"] == [sha]
    # correct mode: the client got the rewritten step, labelled by its own verdict
    assert [s.text for s in correct.steps] == ["The image shows a car.", "The car is red.", "So the answer is A."]
    assert [s.kind for s in correct.steps] == ["perception", "perception", "reasoning"]
    assert [s.faithful for s in correct.steps] == [True, True, None]
    assert correct.steps[1].extra["original_text"] == "The car is blue." and correct.steps[1].extra["attempts"] == 1
    assert correct.answer == "The image shows a car. The car is red. So the answer is A."
    (original,) = chains_from_traces([trace_file], view="original", modes=["correct"], skip_empty=True)[:1]
    assert [s.text for s in original.steps] == ["The image shows a car.", "The car is blue.", "So the answer is A."]
    assert [s.faithful for s in original.steps] == [True, False, None]
    assert original.steps[1].extra["delivered_text"] == "The car is red."
    assert upr([correct]).upr == 0.0 and upr([original]).upr == 0.5
    # the two views give the proxy's own residual and detected UPR of the request
    summary = correct.extra["summary"]
    assert (summary["upr_residual"], summary["upr_detected"]) == (upr([correct]).upr, upr([original]).upr)
    # detect mode: the model's text, flagged and not rewritten (the judge reached through OpenAI chat)
    assert [s.faithful for s in detect.steps] == [True, False, None] and detect.extra["judge"] == "qwen"
    # no detector: perception steps are unlabelled, counted as such
    assert [s.faithful for s in unchecked.steps] == [None, None, None]
    assert upr([unchecked]).unlabelled_perception_steps == 2
    # ... and counted as the proxy counts them in its residual UPR
    assert upr([unchecked]).upr_unlabelled_as_unfaithful == unchecked.extra["summary"]["upr_residual"] == 1.0
    # off mode: no session, nothing to label
    assert off.steps == [] and off.question == "" and off.extra["prompt"] is None
    # filters
    assert [c.id for c in chains_from_traces([trace_file], skip_empty=True)] == [correct.id, detect.id, unchecked.id]
    assert [c.id for c in chains_from_traces([trace_file], modes=["detect", "off"])] == [detect.id, off.id]


def test_bad_traces_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="trace schema version 2 is not supported"):
        chain_of_trace({"version": 2, "id": "x", "steps": []})
    with pytest.raises(TraceFormatError, match="needs a string 'id'"):
        chain_of_trace({"version": 1, "steps": []})
    with pytest.raises(TraceFormatError, match="step 0: a trace step must be an object with a 'text'"):
        chain_of_trace({"version": 1, "id": "x", "steps": [{"kind": "perception"}]})
    path = tmp_path / "t.jsonl"
    path.write_text('{"version": 1, "id": "x", "steps": []}\n{"version": 1, "id": "x", "steps": []}\n')
    with pytest.raises(TraceFormatError, match=r"t.jsonl:2: id 'x' also at .*t.jsonl:1"):
        chains_from_traces([path])
    path.write_text("not json\n")
    with pytest.raises(TraceFormatError, match=r"t.jsonl:1: not valid JSON"):
        chains_from_traces([path])
