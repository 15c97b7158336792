"""`bench replay` and `bench option-curve` against real vLLM serving the committed ShapesWorld model.

The chains are held-out ShapesWorld items (half with a planted perception error) exported with their
images, so the model sees the real pixels. What the model says is its own business: these tests check
that every call is made, answered and read, not how good the model is.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faithproxy.benchmarks.evaluation.labelled import read_chains
from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
from faithproxy.cli import main

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (WEIGHTS_DIR / "config.json").is_file(), reason="no committed ShapesWorld weights"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


@pytest.fixture(scope="module")
def chains_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from faithproxy.benchmarks.shapesworld.dataset import generate_items
    from faithproxy.benchmarks.shapesworld.export import write_chains_jsonl
    from faithproxy.benchmarks.shapesworld.model.scoring import HELDOUT_SEED

    root = tmp_path_factory.mktemp("sw")
    items = list(generate_items(HELDOUT_SEED, 10, hallucination_rate=0.5, start=2000))
    write_chains_jsonl(root / "chains.jsonl", ((i.id, i.scene, i.question, i.chain) for i in items), root / "img")
    return root / "chains.jsonl"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from faithproxy.benchmarks.shapesworld.model.evaluate import SERVED_NAME
    from faithproxy.benchmarks.tinyvlm.serve import VLLMStartError, start_vllm

    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    try:
        server = start_vllm(WEIGHTS_DIR, served_model_name=SERVED_NAME, log_path=log_path, health_timeout=600)
    except VLLMStartError as exc:
        pytest.fail(str(exc))
    with server:
        yield server


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    quiet = ["--no-progress"] if argv[0] != "report" else []
    code = main(["bench", *argv, *quiet, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_replay_of_the_prompt_detector(
    server: Any, chains_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prompt.jsonl"
    report = bench(capsys, "replay", "--traces", str(chains_file), "--detector", "prompt", "--generator",
                   server.base_url, "--model", server.model, "--out", str(out))  # fmt: skip
    gold = read_chains(chains_file)
    perception = sum(c.perception_steps for c in gold)
    assert report["errors"] == 0 and report["images_missing"] == 0 and report["chains"] == 10
    assert report["detector_calls"] == 10  # every chain fits one batch
    assert report["generator_tokens"] > 0 and report["latency_p50_s"] > 0
    assert report["f1"]["steps"] == perception and report["f1"]["abstained"] == 0
    assert report["f1"]["unfaithful"]["support"] == sum(c.unfaithful_steps for c in gold) > 0
    predicted = read_chains(out)
    labels = [s.faithful for c in predicted for s in c.steps if s.kind == "perception"]
    assert len(labels) == perception and None not in labels


def test_option_curve(server: Any, chains_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lp.jsonl"
    # ShapesWorld chains end "</think>\n\nThe answer is C.": the prefix stops before the letter's token
    data = bench(capsys, "option-curve", str(chains_file), "--target", f"{server.base_url}/v1", "--model",
                 server.model, "--think-open", "<think>\n", "--answer-prefix", "\n</think>\n\nThe answer is",
                 "--out", str(out))  # fmt: skip
    assert data["chains"] == 10 and data["failed_requests"] == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    gold = read_chains(chains_file)
    assert [len(r["option_logprobs"]) for r in records] == [len(c.steps) + 1 for c in gold]
    # after the whole chain the model answers with an option letter, so letters are among its top tokens
    assert all(r["option_logprobs"][-1] for r in records)
    report = bench(capsys, "report", "--out", str(tmp_path / "report"), "--logprobs", str(out))
    assert report["curve"]["chains"] == 10 and (tmp_path / "report" / "option_probability.png").is_file()
