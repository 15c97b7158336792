"""`faithproxy export pairs` on what the real proxy app recorded: trace files and reports in a real Redis
(a scripted vLLM underneath, the local judge on the wire, as tests/benchmarks/evaluation/test_from_traces.py)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import create_app as judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.flywheel import export_cli
from faithproxy.flywheel.data import load_rows
from faithproxy.flywheel.images import ImageIndex
from faithproxy.flywheel.pairs import HELDOUT, TRAIN, ExportOptions, export_pairs, split_of
from faithproxy.flywheel.records import TRACE_VERSIONS, FlywheelError, read_redis, read_traces
from faithproxy.server.app import create_app
from faithproxy.testing import running_app
from tests.redis_server import RedisServer
from tests.support import local_judge_settings

PNG = b"\x89PNG\r\n\x1a\n-not-really-an-image"
OTHER_PNG = b"\x89PNG\r\n\x1a\n-another-image"
FIRST = ["<think>\n", "The image shows a car. ", "The car is blue. ", "So the answer is B.\n</think>\n"]
AFTER_FIX = [" So the answer is A.\n</think>\n"]
ORACLE = {"unfaithful": ["The car is blue."], "reasoning": ["So the answer is B.", "So the answer is A."]}
QUESTION = "What colour is the car? A. red B. blue"


def _sse(texts: list[str]) -> bytes:
    chunks = [{"id": "u", "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]} for t in texts]
    chunks.append({"id": "u", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
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
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return httpx.Response(200, json={"id": "r", "object": "chat.completion", "model": "m", "choices": [choice]})


def _body(png: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    return {"model": "m", "messages": [{"role": "user", "content": content}], "stream": True}


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> dict[str, Any]:
    """Four requests through the real app, traces to a file and reports (with images) to Redis: the same
    image corrected twice (a duplicate), another image corrected, and one in detect mode (no rewrite)."""
    work = tmp_path_factory.mktemp("recorded")
    ids = asyncio.run(_record(work, redis_url))
    return {"trace": work / "traces.jsonl", "images": work / "images", "ids": ids, "work": work}


async def _record(work: Path, redis_url: str) -> list[str]:
    trace = work / "traces.jsonl"
    images = work / "images"
    images.mkdir()
    (images / "car.png").write_bytes(PNG)
    (images / "other.png").write_bytes(OTHER_PNG)
    ids = []
    async with running_judge_server(judge_app(ORACLE)) as judge_url:
        settings = local_judge_settings(
            "http://vllm.test", judge_url, trace_path=str(trace), reports_url=redis_url, reports_keep_images=True
        )
        app = create_app(settings, upstream_transport=httpx.MockTransport(vllm))
        async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            for png, mode in [(PNG, "correct"), (PNG, "correct"), (OTHER_PNG, "correct"), (PNG, "detect")]:
                response = await http.post("/v1/chat/completions", json=_body(png), headers={"x-faithproxy-mode": mode})
                assert response.status_code == 200, response.text
                ids.append(response.headers["x-faithproxy-request-id"])
    return ids


def test_one_pair_per_corrected_step_from_traces(recorded: dict[str, Any]) -> None:
    exported = export_pairs(read_traces([recorded["trace"]]), ImageIndex([recorded["images"]]), ExportOptions())
    pairs = exported.pairs[TRAIN]
    # three corrected steps; the second request repeats the first's exactly; detect mode rewrote nothing
    assert len(pairs) == 2 and exported.counts["left_out_duplicate"] == 1
    first = pairs[0]
    assert first["prompt"] == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    # the chain before the step is cut from the delivered text: its tag and spacing are the model's
    assert first["chosen"] == [{"role": "assistant", "content": "<think>\nThe image shows a car. The car is red."}]
    assert first["rejected"] == [{"role": "assistant", "content": "<think>\nThe image shows a car. The car is blue."}]
    assert first["images"] == [str(recorded["images"] / "car.png")]
    meta = first["metadata"]
    assert meta["request_id"] == recorded["ids"][0] and meta["model"] == "m" and meta["judge"] == "claude"
    assert (meta["detected"], meta["verdict"], meta["retries"]) == ("unfaithful", "faithful", 1)
    assert meta["image_sha256"] == [hashlib.sha256(PNG).hexdigest()] and meta["source"] == "trace"
    assert pairs[1]["images"] == [str(recorded["images"] / "other.png")]


def test_reports_in_redis_carry_the_requests_data_urls(recorded: dict[str, Any], redis_url: str) -> None:
    requests = list(read_redis(redis_url))
    assert {r.request_id for r in requests} == set(recorded["ids"])
    exported = export_pairs(requests, ImageIndex(), ExportOptions(dedupe=False))
    pairs = exported.pairs[TRAIN]
    assert len(pairs) == 3  # duplicates kept when asked
    assert {p["images"][0] for p in pairs} == {
        "data:image/png;base64," + base64.b64encode(png).decode() for png in (PNG, OTHER_PNG)
    }
    assert all(p["rejected"][0]["content"].endswith("The car is blue.") for p in pairs)
    assert all(p["metadata"]["source"] == "report" for p in pairs)


def test_filters_confidence_images_and_heldout_split(recorded: dict[str, Any]) -> None:
    traces = list(read_traces([recorded["trace"]]))
    # the local judge gives no confidence: a minimum leaves every flag out
    strict = export_pairs(traces, ImageIndex([recorded["images"]]), ExportOptions(min_confidence=0.5))
    assert strict.pairs[TRAIN] == [] and strict.counts["left_out_confidence"] == 3
    # images that are not at hand are never fetched: their pairs are left out and counted
    blind = export_pairs(traces, ImageIndex(), ExportOptions())
    assert blind.pairs[TRAIN] == [] and blind.counts["left_out_image_not_at_hand"] == 3
    # the split follows the images: every pair of one image lands on the same side
    options = ExportOptions(heldout_fraction=0.5, split_salt="s")
    split = export_pairs(traces, ImageIndex([recorded["images"]]), options)
    for side in (TRAIN, HELDOUT):
        for pair in split.pairs[side]:
            assert split_of(pair["metadata"]["image_sha256"], 0.5, "s") == side == pair["metadata"]["split"]
    sides = {split_of([hashlib.sha256(b).hexdigest()], 0.5, "s") for b in (PNG, OTHER_PNG)}
    assert sum(len(v) for v in split.pairs.values()) == 2 and len(sides) >= 1


def test_an_older_trace_schema_is_refused_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"version": min(TRACE_VERSIONS) - 1, "id": "x", "steps": []}) + "\n")
    with pytest.raises(FlywheelError, match=r"old\.jsonl:1: trace schema version 0 is older than this exporter"):
        list(read_traces([old]))
    assert export_cli.main(["pairs", "--traces", str(old), "--out", str(tmp_path / "p.jsonl")]) == 1
    assert "record them again" in capsys.readouterr().err


def test_the_readers_version_is_the_servers() -> None:
    from faithproxy.server.observe.traces import TRACE_SCHEMA_VERSION

    assert max(TRACE_VERSIONS) == TRACE_SCHEMA_VERSION


def test_the_command_writes_pairs_heldout_and_summary(recorded: dict[str, Any]) -> None:
    out = recorded["work"] / "cmd" / "pairs.jsonl"
    argv = ["pairs", "--traces", str(recorded["trace"]), "--images", str(recorded["images"]), "--out", str(out)]
    assert export_cli.main([*argv, "--heldout", "0.5"]) == 0
    summary = json.loads(export_cli.summary_path(out).read_text())
    rows = load_rows(out) + load_rows(export_cli.heldout_path(out))
    assert {Path(r["images"][0]).read_bytes() for r in rows} == {PNG, OTHER_PNG}  # relative to the file's folder
    lines = out.read_text().splitlines() + export_cli.heldout_path(out).read_text().splitlines()
    assert len(lines) == summary["pairs"][TRAIN] + summary["pairs"][HELDOUT] == 2
