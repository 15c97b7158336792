"""MMVP loader and pair accuracy on a fixture in the release's layout (Questions.csv + MMVP Images/)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from PIL import Image

from faithproxy.benchmarks.evaluation import datasets
from faithproxy.benchmarks.evaluation.datasets import mmvp
from faithproxy.benchmarks.evaluation.datasets.release import DatasetError
from tests.benchmarks.evaluation.releases import unpack

ROWS = [  # index, question, options, correct answer
    ("1", "Is the door open or closed?", "(a) Open (b) Closed", "(a)"),
    ("2", "Is the door open or closed?", "(a) Open (b) Closed", "(b)"),
    ("3", "Is the dog facing left or right?", "(a) Left (b) Right", "(a)"),
    ("4", "Is the dog facing left or right?", "(a) Left (b) Right", "(b)"),
    ("5", "Are there two cups?", "(a) Yes (b) No", "(b)"),
    ("6", "Are there two cups?", "(a) Yes (b) No", "(a)"),
]


def write_mmvp(root: Path, rows=ROWS, index_header: str = "lndex") -> Path:
    (root / "MMVP Images").mkdir(parents=True)
    with (root / "Questions.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([index_header, "Question", "Options", "Correct Answer"])
        writer.writerows(rows)
    for index, *_ in rows:
        Image.new("RGB", (8, 8), (int(index) * 30, 0, 0)).save(root / "MMVP Images" / f"{index}.jpg")
    return root


def test_loads_the_release_layout(tmp_path: Path) -> None:
    items = datasets.get("MMVP").load(write_mmvp(tmp_path))
    assert [i.id for i in items] == [f"mmvp-{n}" for n in range(1, 7)]
    first = items[0]
    assert first.options == ("Open", "Closed") and first.answer == "A" and items[1].answer == "B"
    assert first.prompt == "Is the door open or closed? Options: A. Open B. Closed"
    assert first.image == tmp_path / "MMVP Images" / "1.jpg" and first.image.exists()
    assert [i.extra["pair"] for i in items] == [0, 0, 1, 1, 2, 2]


def test_plain_index_header_and_instruction(tmp_path: Path) -> None:
    items = mmvp.load(write_mmvp(tmp_path, index_header="Index"), instruction="Answer with a letter.")
    assert items[5].id == "mmvp-6"
    assert items[5].prompt == "Are there two cups? Options: A. Yes B. No Answer with a letter."


PREDICTIONS = {
    "mmvp-1": {"id": "mmvp-1", "text": r"\boxed{A}"},
    "mmvp-2": {"id": "mmvp-2", "text": "The answer is (b)", "reasoning": "It looks shut, so A is wrong."},
    "mmvp-3": {"id": "mmvp-3", "text": "Right."},  # option text: B, wrong
    "mmvp-4": "B",
    "mmvp-5": {"id": "mmvp-5", "text": "I cannot tell."},  # unparseable
    # mmvp-6 missing
}


def test_pair_accuracy_needs_both_questions(tmp_path: Path) -> None:
    items = mmvp.load(write_mmvp(tmp_path))
    scores = mmvp.score(items, PREDICTIONS)
    assert scores == {
        "questions": 6,
        "accuracy": pytest.approx(3 / 6),
        "pairs": 3,
        "pair_accuracy": pytest.approx(1 / 3),
        "incomplete_pairs": 0,
        "unparsed": 2,
    }
    assert [mmvp.correct(i, PREDICTIONS.get(i.id)) for i in items] == [True, True, False, True, False, False]


def test_errors_count_wrong_and_incomplete_pairs_are_left_out(tmp_path: Path) -> None:
    items = mmvp.load(write_mmvp(tmp_path))[:3]
    predictions = {**PREDICTIONS, "mmvp-2": {"id": "mmvp-2", "text": "B", "error": "timeout"}}
    scores = mmvp.score(items, predictions)
    assert scores["accuracy"] == pytest.approx(1 / 3)
    assert (scores["pairs"], scores["pair_accuracy"], scores["incomplete_pairs"]) == (1, 0.0, 1)


def test_empty_run() -> None:
    scores = mmvp.score([], {})
    assert scores["accuracy"] is None and scores["pair_accuracy"] is None and scores["pairs"] == 0


def test_registry_suggests_a_name() -> None:
    with pytest.raises(KeyError, match="Did you mean 'mmvp'"):
        datasets.get("mmpv")


def test_missing_file_names_the_layout(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="Questions.csv"):
        mmvp.load(tmp_path)


def test_a_missing_image_stops_the_load_naming_the_file_and_the_count(tmp_path: Path) -> None:
    root = write_mmvp(tmp_path)
    (root / "MMVP Images" / "3.jpg").unlink()
    (root / "MMVP Images" / "5.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DatasetError) as caught:
        mmvp.load(root)
    message = str(caught.value)
    assert "2 record(s) cannot be used" in message and "missing_image 1" in message
    assert "unreadable_image 1" in message and "Index 3" in message and "3.jpg" in message
    release = mmvp.read(root)
    assert [i.id for i in release.items] == ["mmvp-1", "mmvp-2", "mmvp-4", "mmvp-6"]  # the rest stay usable
    assert release.splits == {"test": 6}


def test_an_answer_beyond_the_options_is_a_problem(tmp_path: Path) -> None:
    rows = [*ROWS[:2], ("3", "Which one?", "(a) Left (b) Right", "(c)")]
    release = mmvp.read(write_mmvp(tmp_path, rows=rows))
    assert release.problem_counts == {"unknown_value": 1}
    assert "Correct Answer '(c)'" in release.problems[0].detail


def test_official_answer_file_and_its_judge(tmp_path: Path) -> None:
    """scripts/evaluate_mllm.py writes question_id / response; gpt_grader.py's yes|no decides when kept
    (kept here as gpt_grade). Pair accuracy: pair 1 both yes, pair 2 one no, pair 3 both read right."""
    items = mmvp.load(write_mmvp(tmp_path))
    records = [
        {"question_id": 1, "prompt": "...", "answer": "(a)", "response": "(b) Closed", "gpt_grade": "yes"},
        {"question_id": 2, "prompt": "...", "answer": "(b)", "response": "(b)", "gpt_grade": "yes"},
        {"question_id": 3, "prompt": "...", "answer": "(a)", "response": "(a)", "gpt_grade": "no"},
        {"question_id": 4, "prompt": "...", "answer": "(b)", "response": "(b)", "gpt_grade": "yes"},
        {"question_id": 5, "prompt": "...", "answer": "(b)", "response": "(b) No"},
        {"question_id": 6, "prompt": "...", "answer": "(a)", "response": "The answer is (a)."},
    ]
    predictions = mmvp.from_official(records, items)
    assert predictions is not None and mmvp.from_official([{"id": "mmvp-1"}], items) is None
    scores = mmvp.score(items, predictions)
    assert (scores["pairs"], scores["pair_accuracy"]) == (3, pytest.approx(2 / 3))


def test_real_rows_of_the_release(tmp_path: Path) -> None:
    """The committed excerpt holds rows 1, 2, 5, 6 of the published Questions.csv (two whole pairs)."""
    items = mmvp.load(unpack("mmvp", tmp_path / "MMVP"))
    assert [(i.id, i.answer, i.extra["pair"]) for i in items] == [
        ("mmvp-1", "A", 0), ("mmvp-2", "B", 0), ("mmvp-5", "A", 2), ("mmvp-6", "B", 2),
    ]  # fmt: skip
    assert items[0].prompt == "Are the butterfly's wings closer to being open or closed? Options: A. Open B. Closed"
    assert items[3].options == ("Left", "Right") and items[3].image == tmp_path / "MMVP" / "MMVP Images" / "6.jpg"
    scores = mmvp.score(items, {"mmvp-1": "A", "mmvp-2": "B", "mmvp-5": "B", "mmvp-6": "B"})
    assert (scores["pairs"], scores["pair_accuracy"], scores["accuracy"]) == (2, 0.5, 0.75)
