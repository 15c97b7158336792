"""MMEvalPro: the Parquet release layout and the official auto_score.py rules.

The scoring checks run on the official demo outputs (chenllliang/MMEvalPro demo_model_output.json, 6,414
rows; data/README.md): all 2,637 MMMU and MathVista rows, and 90 rows (10 triplets of each source) whose
figures are counted by hand. The rules are auto_score.py's: right = `answer == model_output`; per source
and over all rows; genuine = triplets (by triplet_id) with all members right; percentages rounded to 2;
Macro_Average = mean of the rounded source figures. The release excerpt's index, triplet_id, answer,
source and eval_type are the real ones of those demo rows; its question and choice texts are placeholders
(the Parquet release is on the hub only, and the demo outputs carry no question text).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faithproxy.benchmarks.evaluation.cli import main as bench_main
from faithproxy.benchmarks.evaluation.datasets import mmevalpro
from faithproxy.benchmarks.evaluation.datasets.release import IMAGE_CACHE
from tests.benchmarks.evaluation.releases import DATA, unpack

DEMO = DATA / "mmevalpro" / "demo_model_output_excerpt.json"
DEMO_TWO_SOURCES = DATA / "mmevalpro" / "demo_model_output_mmmu_mathvista.json"

# The score file the repository's README prints for demo_model_output.json (auto_score.py's output).
README_SCORES = {
    "MMMU": {"genuine_accuracy_score": 17.11, "average_score": 52.7, "origin_score": 45.13,
             "perception_score": 62.24, "knowledge_score": 50.74},
    "MathVista": {"genuine_accuracy_score": 15.37, "average_score": 51.67, "origin_score": 55.93,
                  "perception_score": 50.37, "knowledge_score": 48.7},
    "ScienceQA": {"genuine_accuracy_score": 44.96, "average_score": 74.61, "origin_score": 80.54,
                  "perception_score": 72.2, "knowledge_score": 71.09},
    "Macro_Average": {"genuine_accuracy_score": 25.81, "average_score": 59.66, "origin_score": 60.53,
                      "perception_score": 61.6, "knowledge_score": 56.84},
    "Micro_Average": {"genuine_accuracy_score": 33.07, "average_score": 65.34, "origin_score": 68.71,
                      "perception_score": 65.11, "knowledge_score": 62.21},
}  # fmt: skip


@pytest.fixture
def release_dir(tmp_path: Path) -> Path:
    return unpack("mmevalpro", tmp_path / "MMEvalPro")


def test_reads_the_parquet_release(release_dir: Path) -> None:
    release = mmevalpro.read(release_dir)
    assert release.problems == [] and release.splits == {"MMMU": 6, "MathVista": 3, "ScienceQA": 6}
    items = {i.id: i for i in release.items}
    assert len(items) == 15
    first = items["mmevalpro-48"]
    assert first.answer == "C" and first.options == ("option one", "option two", "option three", "option four")
    assert first.extra["triplet_id"] == 17 and first.extra["eval_type"] == "Origin"
    assert first.image == release_dir / IMAGE_CACHE / "mmevalpro-48.png" and first.image.stat().st_size > 0
    assert first.prompt.endswith("Options: A. option one B. option two C. option three D. option four")
    # answers no chosen letter can equal are kept (the official scorer counts them wrong) and noted
    assert [n.record.split("(")[1] for n in release.notes] == ["index 62, triplet 21)", "index 6335, triplet 2112)"]
    assert "'South Carolina'" in release.notes[1].detail


def test_filters(release_dir: Path) -> None:
    assert len(mmevalpro.load(release_dir, source="mathvista")) == 3
    perception = mmevalpro.load(release_dir, eval_type="Perception")
    assert [i.id for i in perception] == ["mmevalpro-49", "mmevalpro-61", "mmevalpro-2197", "mmevalpro-6322",
                                          "mmevalpro-6334"]  # fmt: skip


DEMO_FIGURES = {
    # MMMU triplets 14-23: all right only 17; Origin right 14 17 20 22 23; Perception all but 18;
    # Knowledge right 15 16 17 19 (21's answer is "Z")
    "MMMU": {"genuine_accuracy_score": 10.0, "average_score": 60.0, "origin_score": 50.0,
             "perception_score": 90.0, "knowledge_score": 40.0},
    # MathVista triplets 724-733: all right only 733; Origin 725 730 732 733; Perception 724 726 727 728
    # 731 733; Knowledge all but 726 729 731
    "MathVista": {"genuine_accuracy_score": 10.0, "average_score": 56.67, "origin_score": 40.0,
                  "perception_score": 60.0, "knowledge_score": 70.0},
    # ScienceQA triplets 2108-2117: all right 2108 2114 2116; Origin all but 2115 2117; Perception all but
    # 2110; Knowledge 2108 2110 2114 2115 2116 (2112's answer is "South Carolina")
    "ScienceQA": {"genuine_accuracy_score": 30.0, "average_score": 73.33, "origin_score": 80.0,
                  "perception_score": 90.0, "knowledge_score": 50.0},
    # means of the rounded source figures
    "Macro_Average": {"genuine_accuracy_score": 16.67, "average_score": 63.33, "origin_score": 56.67,
                      "perception_score": 80.0, "knowledge_score": 53.33},
    # all 90 rows: 5/30 triplets, 57/90 questions, 17 24 16 of 30 per type
    "Micro_Average": {"genuine_accuracy_score": 16.67, "average_score": 63.33, "origin_score": 56.67,
                      "perception_score": 80.0, "knowledge_score": 53.33},
}  # fmt: skip


def test_official_demo_rows() -> None:
    assert mmevalpro.auto_score(json.loads(DEMO.read_text())) == DEMO_FIGURES


def test_macro_average_of_the_published_demo_figures() -> None:
    """The README's demo score file: per source as published; the script's macro rule gives its 25.81
    genuine (and 59.66 average) from them."""
    published = {s: README_SCORES[s] for s in mmevalpro.SOURCES}
    assert mmevalpro.macro_average(published) == README_SCORES["Macro_Average"]
    assert mmevalpro.macro_average({"MMMU": published["MMMU"]}) is None  # needs all three sources


def test_demo_outputs_of_two_sources_give_the_published_figures() -> None:
    """All MMMU (triplets 1-339) and MathVista (340-879) rows of demo_model_output.json, scored by our
    auto_score: exactly the README's figures for those two sources."""
    rows = json.loads(DEMO_TWO_SOURCES.read_text())
    assert len(rows) == 2637 and len({r["triplet_id"] for r in rows}) == 879
    scores = mmevalpro.auto_score(rows)
    assert scores["MMMU"] == README_SCORES["MMMU"]
    assert scores["MathVista"] == README_SCORES["MathVista"]
    assert scores["ScienceQA"] is None and scores["Macro_Average"] is None  # a source is missing


def _science_qa_rows(first_index: int, first_triplet: int) -> list[dict[str, object]]:
    """Stand-ins for the demo's 1,259 ScienceQA triplets (880-2138; the file ends at index 6413), right
    exactly as often as the README's ScienceQA percentages say: with 1,259 triplets each figure rounds
    from one count only (44.96 -> 566 triplets all right, 80.54 -> 1,014 Origin, 72.2 -> 909 Perception,
    71.09 -> 895 Knowledge). The first 566 triplets are all right; of the other 693, Origin is right in
    the first 448, Perception in the last 343, Knowledge in the first 329, so none is all right."""
    rows: list[dict[str, object]] = []
    for n in range(1259):
        j = n - 566
        right = (True, True, True) if j < 0 else (j < 448, j >= 693 - 343, j < 329)
        for k, (kind, ok) in enumerate(zip(mmevalpro.EVAL_TYPES, right, strict=True)):
            rows.append({"index": first_index + 3 * n + k, "triplet_id": first_triplet + n, "answer": "A",
                         "model_output": "A" if ok else "B", "source": "ScienceQA", "eval_type": kind})  # fmt: skip
    return rows


def test_whole_demo_score_file_micro_and_macro() -> None:
    """The real MMMU and MathVista rows plus ScienceQA stand-ins with the published ScienceQA counts: our
    auto_score gives the README's whole score file, Micro_Average 33.07 (707 of 2,138 triplets) and
    Macro_Average 25.81 included. (The README's "2,068 triplets, 6,204 questions" is not the demo file's
    size: it holds 2,138 triplets, 6,414 rows.)"""
    rows = json.loads(DEMO_TWO_SOURCES.read_text())
    rows += _science_qa_rows(first_index=len(rows), first_triplet=880)
    assert len(rows) == 6414 and rows[-1]["index"] == 6413 and rows[-1]["triplet_id"] == 2138
    assert mmevalpro.auto_score(rows) == README_SCORES


def test_run_predictions_score_like_the_official_rows(release_dir: Path) -> None:
    """The chosen letter is the model output; the demo's outputs, said in words, give the demo's figures."""
    items = mmevalpro.load(release_dir)
    outputs = {str(r["index"]): r["model_output"] for r in json.loads(DEMO.read_text())}
    outputs.update({"48": "C", "49": "C", "50": "C", "6333": "C", "6334": "A"})  # rows outside the demo excerpt
    predictions = {i.id: {"id": i.id, "text": f"The answer is {outputs[i.id.split('-')[1]]}."} for i in items}
    scores = mmevalpro.score(items, predictions)
    assert scores["MMMU"]["genuine_accuracy_score"] == 50.0  # triplet 17 right, 21 wrong ("Z")
    assert scores["ScienceQA"]["genuine_accuracy_score"] == 50.0  # 2108 right, 2112 wrong ("South Carolina")
    assert scores["MathVista"]["genuine_accuracy_score"] == 100.0
    assert scores["Micro_Average"]["average_score"] == 80.0  # 12 of 15: index 60 (C for A), 62, 6335
    assert (scores["unmatchable_answers"], scores["unparsed"], scores["missing"]) == (2, 0, 0)
    predictions["mmevalpro-48"] = {"id": "mmevalpro-48", "text": None, "error": "timeout"}
    assert mmevalpro.score(items, predictions)["missing"] == 1


def test_bench_score_on_the_official_output_format(release_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_main(["score", "--dataset", "mmevalpro", "--data-dir", str(release_dir), "--predictions", str(DEMO)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "official"
    metrics = out["metrics"]
    assert {k: metrics[k] for k in DEMO_FIGURES} == DEMO_FIGURES
    # 90 demo rows; the release excerpt holds 15 of them (the others are not in it), all agreeing
    assert (metrics["rows"], metrics["rows_not_in_release"], metrics["rows_disagreeing"]) == (90, 75, 0)
