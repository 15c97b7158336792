"""`bench run` end to end: an MMVP-layout dataset of the fixture model's questions, through faithproxy in
front of REAL vLLM (correct mode) and straight to vLLM (vanilla), resumed, scored.

The fixture model (benchmarks/tinyvlm/fixture_spec.py) answers its five questions with known chains: `red_circle`
and `blue_square` carry a planted wrong perception step. Corrected, `red_circle` is fixed (answer A,
right); `blue_square`'s regeneration fails on purpose (residual step, answer B, wrong). Vanilla both are
wrong. The MMVP prompt `Question Options: A. x B. y C. z` is exactly the fixture's question text.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from faithproxy.benchmarks.evaluation import cli as bench_cli
from faithproxy.benchmarks.evaluation import run as bench_run
from faithproxy.benchmarks.evaluation.labelled import read_chains
from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.server.app import create_app
from faithproxy.testing import running_app
from tests.support import local_judge_settings

pytestmark = [pytest.mark.integration]

# (fixture, MMVP question, options, correct answer): two MMVP pairs
ROWS = [
    ("red_circle", "What colour is the shape?", "(a) red (b) blue (c) green", "(a)"),
    ("green_circle", "What colour is the shape?", "(a) red (b) blue (c) green", "(c)"),
    ("blue_square", "How many corners does the shape have?", "(a) 0 (b) 3 (c) 4", "(c)"),
    ("yellow_triangle", "How many corners does the shape have?", "(a) 0 (b) 3 (c) 4", "(b)"),
]


def write_dataset(root: Path) -> Path:
    (root / "MMVP Images").mkdir(parents=True)
    with (root / "Questions.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["lndex", "Question", "Options", "Correct Answer"])
        for index, (fixture, question, options, answer) in enumerate(ROWS, start=1):
            writer.writerow([index, question, options, answer])
            (root / "MMVP Images" / f"{index}.png").write_bytes(spec.render_fixture_image(fixture))
    return root


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_run.add_arguments(parser)
    return parser.parse_args(list(argv))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
async def proxy_url(vllm_server: Any) -> AsyncIterator[str]:
    judge_app = create_judge_app(spec.oracle_json())
    async with running_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url:
        async with running_app(create_app(local_judge_settings(vllm_server.base_url, judge_url))) as url:
            yield url


async def test_prompts_match_the_fixture_questions(tmp_path: Path) -> None:
    from faithproxy.benchmarks.evaluation.datasets import mmvp

    items = mmvp.load(write_dataset(tmp_path))
    assert [i.prompt for i in items] == [spec.get(row[0]).question for row in ROWS]
    assert [i.answer for i in items] == [spec.get(row[0]).correct_answer for row in ROWS]
    message = bench_run.messages_for(items[0])[0]
    assert message["content"][0]["image_url"]["url"] == spec.data_url("red_circle")


async def test_vanilla_and_corrected_runs(
    vllm_server: Any, proxy_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_dataset(tmp_path / "mmvp")
    common = ["--dataset", "mmvp", "--data-dir", str(data), "--max-tokens", "200", "--concurrency", "2"]

    # vanilla, straight to vLLM; a failed earlier record of item 2 is asked again on resume
    vanilla = tmp_path / "vanilla"
    vanilla.mkdir()
    (vanilla / "predictions.jsonl").write_text(json.dumps({"id": "mmvp-2", "error": "APITimeoutError"}) + "\n")
    args = parse(*common, "--target", vllm_server.base_url, "--mode", "vanilla", "--out", str(vanilla))
    assert await bench_run.run(args) == 0
    scores = json.loads((vanilla / "scores.json").read_text())
    assert scores["model"] == vllm_server.model  # the target's first model
    assert scores["metrics"]["accuracy"] == 0.5 and scores["metrics"]["pair_accuracy"] == 0.0
    assert (scores["answered"], scores["errors"]) == (4, 0)
    assert scores["faithfulness"]["requests_with_summary"] == 0  # vLLM sends no summary
    records = {r["id"]: r for r in lines(vanilla / "predictions.jsonl")[1:]}
    assert records["mmvp-1"]["text"] == spec.chain_text(spec.get("red_circle"))
    assert json.loads(capsys.readouterr().out) == scores  # the scores are printed too

    # corrected, through faithproxy: two items first, then the rest (the first two are not asked again)
    corrected = tmp_path / "corrected"
    base = [*common, "--target", proxy_url, "--mode", "correct", "--model", vllm_server.model, "--out", str(corrected)]
    assert await bench_run.run(parse(*base, "--limit", "2")) == 0
    assert json.loads((corrected / "scores.json").read_text())["metrics"]["pair_accuracy"] == 1.0
    assert await bench_run.run(parse(*base)) == 0
    records = lines(corrected / "predictions.jsonl")
    assert sorted(r["id"] for r in records[:2]) == ["mmvp-1", "mmvp-2"]  # the limited run came first
    assert sorted(r["id"] for r in records) == ["mmvp-1", "mmvp-2", "mmvp-3", "mmvp-4"]  # each asked once
    by_id = {r["id"]: r for r in records}
    assert by_id["mmvp-1"]["text"] == spec.corrected_chain_text(spec.get("red_circle"))
    assert by_id["mmvp-1"]["request_id"]

    # per-step verdicts are kept: the fixed step of item 1, the residual step of item 3
    steps_1 = by_id["mmvp-1"]["faithfulness"]["steps"]
    (fixed,) = [s for s in steps_1 if s["regenerated"]]
    assert fixed["original_text"] == "The circle is blue." and fixed["detected"] == "unfaithful"
    assert fixed["verdict"] == "faithful" and fixed["kind"] == "perception"
    residual = [s for s in by_id["mmvp-3"]["faithfulness"]["steps"] if s["residual"]]
    assert len(residual) == 1 and residual[0]["verdict"] == "unfaithful"

    scores = json.loads((corrected / "scores.json").read_text())
    assert scores["metrics"] == {
        "questions": 4,
        "accuracy": 0.75,  # blue_square stays wrong: its regeneration never succeeds
        "pairs": 2,
        "pair_accuracy": 0.5,
        "incomplete_pairs": 0,
        "unparsed": 0,
    }
    totals = scores["faithfulness"]
    assert totals["requests_with_summary"] == 4
    assert totals["perception_steps"] == 12  # three per chain
    assert (totals["unfaithful_detected"], totals["residual"], totals["fixed"]) == (2, 1, 1)
    assert totals["upr_detected"] == pytest.approx(2 / 12) and totals["upr_residual"] == pytest.approx(1 / 12)

    # the run as labelled chains: steps with the proxy's verdicts, and whether each answer was right
    chains = {c.id: c for c in read_chains(corrected / "chains.jsonl")}
    one = chains["mmvp-1"]
    assert one.extra["correct"] is True and one.extra["steps_aligned"] is True and one.gold_answer == "A"
    corrected_sentences = spec.corrected_chain_text(spec.get("red_circle")).split("\n")[1]
    assert " ".join(s.text for s in one.steps) == f"{corrected_sentences} The answer is A."
    (rewritten,) = [s for s in one.steps if s.extra.get("regenerated")]
    assert (rewritten.text, rewritten.faithful, rewritten.kind) == ("The circle is red.", True, "perception")
    assert rewritten.extra["original_text"] == "The circle is blue." and rewritten.extra["detected"] == "unfaithful"
    three = chains["mmvp-3"]
    assert three.extra["correct"] is False
    assert [s.text for s in three.steps if s.faithful is False] == ["The shape is a triangle."]
    plain = {c.id: c for c in read_chains(vanilla / "chains.jsonl")}
    assert [plain[f"mmvp-{n}"].extra["correct"] for n in range(1, 5)] == [False, True, False, True]
    assert all(s.kind is None and s.faithful is None for s in plain["mmvp-1"].steps)  # vLLM gives no verdicts

    # ... which `bench report` takes as they are (Table 11 style)
    report = tmp_path / "report"
    argv = ["report", "--out", str(report), "--pair", "MMVP", str(vanilla / "chains.jsonl")]
    assert bench_cli.main([*argv, str(corrected / "chains.jsonl")]) == 0
    (row,) = json.loads((report / "report.json").read_text())["table_11"]
    assert row["vanilla"]["accuracy"] == 0.5 and row["corrected"]["accuracy"] == 0.75
    assert row["corrected"]["upr"] == pytest.approx(1 / 12) and row["vanilla"]["upr"] is None
    assert (report / "upr_vanilla_vs_corrected.png").stat().st_size > 0

    # a finished run resumes without a single request: the target may even be gone
    dead = [*common, "--target", "http://127.0.0.1:9", "--model", vllm_server.model, "--out", str(corrected)]
    assert await bench_run.run(parse(*dead, "--mode", "correct")) == 0
    assert len(lines(corrected / "predictions.jsonl")) == 4
    assert json.loads((corrected / "scores.json").read_text()) == scores

    # resuming into a directory of another mode is refused
    with pytest.raises(SystemExit, match="mode='correct'"):
        await bench_run.run(parse(*dead, "--mode", "vanilla"))


# items asked per excerpt: HallusionBench's first four are asked without a figure, so two more with one
LIMITS = {"mmvp": 2, "hallusionbench": 6, "mmevalpro": 2, "freak": 2, "mmgcot": 2, "mirage": 2}


@pytest.mark.parametrize("name", list(LIMITS))
async def test_every_release_excerpt_through_the_proxy(
    name: str, vllm_server: Any, proxy_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each benchmark's excerpt, unpacked as its release unpacks, read, asked through faithproxy in front of
    the one real vLLM (a few items each), and scored by the official rules: every request answered, the
    proxy's summary kept, the official figures present. What the fixture model answers is its business."""
    from faithproxy.benchmarks.evaluation import datasets
    from tests.benchmarks.evaluation.releases import unpack

    data, n = unpack(name, tmp_path / name), LIMITS[name]
    out = tmp_path / "out"
    args = parse("--dataset", name, "--data-dir", str(data), "--target", proxy_url, "--model", vllm_server.model,
                 "--mode", "correct", "--limit", str(n), "--max-tokens", "64", "--concurrency", "2",
                 "--out", str(out))  # fmt: skip
    assert await bench_run.run(args) == 0
    scores = json.loads((out / "scores.json").read_text())
    assert (scores["items"], scores["answered"], scores["errors"]) == (n, n, 0) and "skipped" not in scores
    module = datasets.get(name)
    assert set(module.OFFICIAL) <= set(scores["metrics"])
    records = lines(out / "predictions.jsonl")
    assert len(records) == n and all(r["request_id"] and isinstance(r["faithfulness"], dict) for r in records)
    items = {i.id: i for i in module.load(data)}
    images = [items[r["id"]].image for r in records if items[r["id"]].image is not None]
    assert len(images) >= 2 and all(image.is_file() for image in images)
    assert len(read_chains(out / "chains.jsonl")) == n
    capsys.readouterr()
