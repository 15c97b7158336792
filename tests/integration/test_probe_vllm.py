"""Probe and cascade detectors through the proxy, on hidden states from REAL vLLM (route 1).

One module-scoped vLLM serves the fixture model with `extract_hidden_states` and the CPU-safe
connector (the session's plain vLLM cannot be switched to it). A probe is trained on the features of
every trained chain variant except `blue_square`'s own chain, then a streamed `blue_square` request
through the proxy must flag its planted step; the hidden states vLLM captured for that request are
compared with transformers' on the same tokens.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from faithproxy.benchmarks.probes import probe_bench, probe_cli
from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.clients.hidden_states import HiddenStatesClient, read_hidden_states, server_args
from faithproxy.clients.vllm import VLLMClient
from faithproxy.server.app import create_app
from faithproxy.testing import metric, running_app
from tests.support import local_judge_settings, proxy_metrics, read_traces

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
LAYERS = [0, 1, 2]  # embeddings, after layer 1, after layer 2 (the last; before the final norm)
PROBE_LAYERS = [1, 2]  # a middle and the last layer: the default recipe
HELD_OUT = "blue_square-0"  # the model's own chain for blue_square, planted error at index 1


@dataclass
class CaptureServer:
    base_url: str
    model: str
    storage: Path


@pytest.fixture(scope="module")
def capture_server(fixture_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureServer]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed in this interpreter")
    from faithproxy.benchmarks.tinyvlm.serve import VLLMStartError, start_vllm

    storage = tmp_path_factory.mktemp("hidden-states")
    log = tmp_path_factory.mktemp("vllm-capture") / "vllm.log"
    try:
        server = start_vllm(
            fixture_model_dir,
            extra_args=server_args(LAYERS, str(storage)),
            log_path=log,
            health_timeout=240,
            env={"PYTHONPATH": str(REPO)},
        )
    except VLLMStartError as exc:
        pytest.fail(str(exc))
    try:
        yield CaptureServer(server.base_url, server.model, storage)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def probe_path(capture_server: CaptureServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A probe trained on teacher-forced features of the 8 other chain variants (labels from the spec)."""
    items = [item for item in probe_bench.fixture_items() if item["id"] != HELD_OUT]

    async def collect() -> list[dict[str, Any]]:
        vllm = VLLMClient(capture_server.base_url)
        hidden = HiddenStatesClient(vllm, LAYERS)
        try:
            return [
                await probe_bench.collect_one(i, capture_server.model, vllm, hidden, "fixture", False) for i in items
            ]
        finally:
            await vllm.aclose()

    records = asyncio.run(collect())
    folder = tmp_path_factory.mktemp("probe")
    traces = folder / "features.jsonl"
    traces.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = folder / "fixture.probe.json"
    args = ["train", "--traces", str(traces), "--labels", "file", "--out", str(out), "--val-fraction", "0"]
    assert probe_cli.main([*args, "--layers", *map(str, PROBE_LAYERS)]) == 0
    assert not list(capture_server.storage.glob("*.safetensors"))  # read and deleted
    return out


@dataclass
class Stack:
    proxy_url: str
    model: str
    client: AsyncOpenAI
    trace_path: Path
    judge_app: Any

    async def metrics(self) -> str:
        return await proxy_metrics(self.proxy_url)

    def traces(self) -> list[dict[str, Any]]:
        return read_traces(self.trace_path)


@pytest.fixture
async def stack(capture_server: CaptureServer, probe_path: Path, tmp_path: Path) -> AsyncIterator[Stack]:
    for old in capture_server.storage.iterdir():
        old.unlink()
    judge_app = create_judge_app(spec.oracle_json())
    async with running_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url:
        settings = local_judge_settings(
            capture_server.base_url,
            judge_url,
            trace_path=str(tmp_path / "traces.jsonl"),
            hidden_states_layers=LAYERS,
            hidden_states_keep_files=True,  # the parity test reads them again
            record_features=True,
            probe_path=str(probe_path),
        )
        async with running_app(create_app(settings)) as proxy_url:
            client = AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0, timeout=120)
            yield Stack(proxy_url, capture_server.model, client, tmp_path / "traces.jsonl", judge_app)
            await client.close()


def request(fixture: str, model: str) -> dict[str, Any]:
    f = spec.get(fixture)
    content = [
        {"type": "image_url", "image_url": {"url": spec.data_url(fixture)}},
        {"type": "text", "text": f.question},
    ]
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 200, "temperature": 0.0}


async def stream(stack: Stack, fixture: str, headers: dict[str, str]) -> tuple[str, list[Any]]:
    events = await stack.client.chat.completions.create(
        **request(fixture, stack.model), stream=True, extra_headers=headers
    )
    text, chunks = "", []
    async for chunk in events:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text, chunks


async def test_probe_flags_planted_step_and_captured_states_match_transformers(
    stack: Stack, capture_server: CaptureServer, fixture_model_dir: Path
) -> None:
    headers = {"X-Faithproxy-Detector": "probe", "X-Faithproxy-Mode": "detect", "X-Faithproxy-Probe-Threshold": "0.5"}
    text, chunks = await stream(stack, "blue_square", headers)
    assert text == spec.chain_text(spec.get("blue_square"))
    verdicts = [v for c in chunks for v in ((c.model_extra or {}).get("faithfulness") or {}).get("verdicts", [])]
    assert [v["index"] for v in verdicts if v["verdict"] == "unfaithful"] == [1]  # "The shape is a triangle."

    (trace,) = stack.traces()
    scores = {s["index"]: s["score"] for s in trace["steps"] if s["kind"] == "perception"}
    assert scores[1] > 0.5 and all(p < 0.5 for i, p in scores.items() if i != 1)
    assert trace["steps"][1]["features"]["layers"] == LAYERS

    # the states vLLM captured for this chain (one prefill per perception step) vs transformers
    files = sorted(capture_server.storage.glob("*.safetensors"))
    assert len(files) == len(scores)
    worst = await asyncio.to_thread(_worst_cosine, fixture_model_dir, files, "blue_square")
    assert worst >= 0.999, worst


def _worst_cosine(model_dir: Path, files: list[Path], fixture: str) -> float:
    """Lowest per-token cosine similarity, over all files, layers and tokens, between vLLM's states and
    transformers' (float32) for the same token ids and image."""
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from faithproxy.benchmarks.tinyvlm.hf_reference import prompt_text

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": spec.get(fixture).question}]}]
    inputs = processor(
        text=[prompt_text(processor.tokenizer, messages)], images=[spec.load_image(fixture)], return_tensors="pt"
    )
    n_prompt = inputs["input_ids"].shape[1]
    last: dict[str, torch.Tensor] = {}
    hook = model.model.language_model.layers[-1].register_forward_hook(
        lambda m, i, o: last.update(out=o[0] if isinstance(o, tuple) else o)
    )
    worst = 1.0
    try:
        for path in files:
            states = read_hidden_states(str(path), LAYERS, keep=True)
            ids = torch.from_numpy(states.token_ids)[None]
            assert torch.equal(ids[0, :n_prompt], inputs["input_ids"][0])  # same chat rendering and image tokens
            with torch.inference_mode():
                out = model(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    pixel_values=inputs["pixel_values"],
                    image_grid_thw=inputs["image_grid_thw"],
                    mm_token_type_ids=(ids == model.config.image_token_id).long(),
                    output_hidden_states=True,
                )
            # vLLM's layer k is the residual stream after k layers; transformers' last hidden state is
            # after the final norm, so the last layer is read from the hook instead
            reference = [out.hidden_states[k][0] if k < len(out.hidden_states) - 1 else last["out"][0] for k in LAYERS]
            captured = torch.from_numpy(states.states)
            for j, ref in enumerate(reference):
                cos = torch.nn.functional.cosine_similarity(ref, captured[:, j], dim=-1)
                worst = min(worst, float(cos.min()))
    finally:
        hook.remove()
    return worst


async def test_probe_for_another_model_is_refused_with_409(stack: Stack) -> None:
    body = request("green_circle", "another-model")
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{stack.proxy_url}/v1/chat/completions", json=body, headers={"X-Faithproxy-Detector": "probe"}
        )
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "probe_mismatch" and "another-model" in error["message"]


async def test_cascade_routes_by_thresholds_and_counts_stages(stack: Stack) -> None:
    # all steps uncertain: the judge decides and corrects the planted step
    text, _ = await stream(
        stack,
        "red_circle",
        {"X-Faithproxy-Detector": "cascade", "X-Faithproxy-Cascade-Low": "0", "X-Faithproxy-Cascade-High": "1"},
    )
    assert text == spec.corrected_chain_text(spec.get("red_circle"))
    metrics = await stack.metrics()
    judged = metric(metrics, "faithproxy_cascade_decisions_total", stage="judge")
    assert judged >= 3 and metric(metrics, "faithproxy_cascade_decisions_total", stage="probe") == 0

    # low == high: the probe decides every perception step, the judge is never asked
    requests = stack.judge_app.state.judge.requests
    headers = {
        "X-Faithproxy-Detector": "cascade",
        "X-Faithproxy-Cascade-Low": "0.5",
        "X-Faithproxy-Cascade-High": "0.5",
    }
    text, _ = await stream(stack, "green_circle", headers)
    assert text == spec.chain_text(spec.get("green_circle"))
    metrics = await stack.metrics()
    assert metric(metrics, "faithproxy_cascade_decisions_total", stage="probe") == 3
    assert metric(metrics, "faithproxy_cascade_decisions_total", stage="judge") == judged
    assert stack.judge_app.state.judge.requests == requests


async def test_judge_traces_record_features_for_probe_training(stack: Stack) -> None:
    await stream(stack, "green_circle", {"X-Faithproxy-Detector": "judge", "X-Faithproxy-Mode": "detect"})
    (trace,) = stack.traces()
    perception = [s for s in trace["steps"] if s["kind"] == "perception"]
    assert len(perception) == 3 and all(s["detected"] == "faithful" for s in perception)
    assert all(s["features"]["layers"] == LAYERS and s["features"]["shape"] == [3, 128] for s in perception)
