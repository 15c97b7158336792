"""MIRAGE: accuracy with relative-error tolerance, F_step/F_claim from judge matches, LHS over M × N."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from PIL import Image

from faithproxy.benchmarks.evaluation.datasets import mirage
from tests.benchmarks.canned_judge import CannedJudge

REFS = [["The left shape is a square.", "So the answer is B."], ["A square is on the left.", "Answer B."]]
RECORDS = [
    {"id": 1, "image": "img/1.png", "question": "Which shape is on the left?", "options": ["circle", "square"],
     "answer": "square", "answer_type": "multiple_choice", "references": REFS,
     "claims": ["a square is on the left"], "hallucination_type": "spatial"},
    {"id": 2, "image": "img/1.png", "question": "How many apples?", "answer": "12", "answer_type": "deterministic",
     "references": [["There are 12 apples."]], "hallucination_type": "logical"},
    {"id": 3, "image": "img/1.png", "question": "How long is the rod (cm)?", "answer": "3.0",
     "answer_type": "approximate", "tolerance": 0.1, "hallucination_type": "factuality"},
    {"id": 4, "image": "img/1.png", "question": "How wide is the rod (cm)?", "answer": "3.0",
     "answer_type": "approximate", "hallucination_type": "factuality"},
    {"id": 5, "image": "img/1.png", "question": "Which cup is full?", "answer": "the left one",
     "hallucination_type": "spatial"},
    {"id": 6, "image": "img/1.png", "question": "How many pears?", "answer": "12", "answer_type": "deterministic",
     "hallucination_type": "context"},
]  # fmt: skip


def write_mirage(root: Path) -> Path:
    (root / "img").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(root / "img" / "1.png")
    (root / "mirage.json").write_text(json.dumps(RECORDS))
    return root


def test_loads_records(tmp_path: Path) -> None:
    items = mirage.load(write_mirage(tmp_path))
    assert [i.id for i in items] == [f"mirage-{n}" for n in range(1, 7)]
    first = items[0]
    assert first.answer == "B" and first.prompt == "Which shape is on the left? Options: A. circle B. square"
    assert first.extra["references"] == REFS and first.image == tmp_path / "img" / "1.png"
    assert items[2].extra["tolerance"] == 0.1 and items[3].extra["tolerance"] == mirage.DEFAULT_TOLERANCE
    assert items[4].extra["answer_type"] == "deterministic"  # no options: deterministic by default


def predictions() -> dict[str, dict]:
    return {
        "mirage-1": {"text": "The answer is B.", "step_match": {"pred": 4, "matched_pred": 2, "ref": 5,
                     "matched_ref": 3}, "claim_match": {"pred": 2, "matched_pred": 2, "ref": 2, "matched_ref": 1},
                     "lhs_scores": [[8] * 5, [6] * 5]},
        "mirage-2": {"text": "The answer is 12 apples.", "reasoning": "I count 3 rows of 4.",
                     "step_match": {"pred": 2, "matched_pred": 0, "ref": 3, "matched_ref": 0},
                     "lhs_scores": [[10, 9, 8, 7, 6]]},
        "mirage-3": {"text": r"So it is \boxed{3.25}"},  # relative error 0.083 <= 0.1
        "mirage-4": {"text": r"So it is \boxed{3.25}"},  # > 0.05
        "mirage-5": {"text": "Answer: The left one.", "lhs_scores": [[1, 2, 3, 4, 5], [5] * 5, [1, 2]]},
    }  # fmt: skip


def test_accuracy_f_scores_and_lhs(tmp_path: Path) -> None:
    scores = mirage.score(mirage.load(write_mirage(tmp_path)), predictions())
    assert scores["accuracy"] == pytest.approx(4 / 6)
    assert scores["f_step"] == pytest.approx((2 * 0.5 * 0.6 / 1.1 + 0.0) / 2)
    assert scores["f_claim"] == pytest.approx(2 / 3)
    # per item LHS: 7, 8, 4 (the malformed third list of item 5 is ignored)
    assert scores["lhs_mean"] == pytest.approx(19 / 3)
    assert scores["lhs_std"] == pytest.approx(
        math.sqrt(((7 - 19 / 3) ** 2 + (8 - 19 / 3) ** 2 + (4 - 19 / 3) ** 2) / 3)
    )
    assert (scores["step_judged"], scores["claim_judged"], scores["lhs_judged"]) == (2, 1, 3)
    by_type = scores["by_type"]
    assert list(by_type) == ["spatial", "logical", "factuality", "context"]
    assert by_type["spatial"] == {"questions": 2, "accuracy": 1.0, "lhs_mean": 5.5, "lhs_std": 1.5}
    assert by_type["factuality"]["accuracy"] == 0.5 and by_type["factuality"]["lhs_mean"] is None
    assert by_type["context"]["accuracy"] == 0.0
    items = mirage.load(tmp_path)
    assert [mirage.correct(i, predictions().get(i.id)) for i in items] == [True, True, True, False, True, False]


def test_answer_edge_cases(tmp_path: Path) -> None:
    item = mirage.load(write_mirage(tmp_path))[2]  # approximate, gold 3.0, tolerance 0.1
    assert mirage.answer_correct(item, "The answer is 2.7 cm.")  # exactly at the tolerance
    assert not mirage.answer_correct(item, "The answer is 2.69 cm.")
    assert not mirage.answer_correct(item, "about three")  # no number
    assert not mirage.answer_correct(item, None)
    assert mirage.parse_number("It is 1,234.5 m") == 1234.5 and mirage.parse_number("-2e3") == -2000.0
    assert mirage.parse_number("none") is None
    assert mirage.f1_of_matches({"pred": 0, "matched_pred": 0, "ref": 0, "matched_ref": 0}) == 0.0
    assert mirage.lhs_of([]) is None


def test_empty() -> None:
    scores = mirage.score([], {})
    assert scores["accuracy"] is None and scores["lhs_mean"] is None and scores["f_step"] is None
    assert scores["by_type"] == {}


async def test_judges_match_steps_and_score_lhs(tmp_path: Path) -> None:
    items = mirage.load(write_mirage(tmp_path))[:3]
    first = CannedJudge(
        {
            "Reference steps:": "Predicted steps: 3\nMatched predicted: 2\nReference steps: 2\nMatched reference: 2",
            "Reference claims:": "Predicted claims: 12\nMatched predicted: 15\n"
            "Reference claims: 1\nMatched reference: 1",
            "Score the model": "Factual accuracy: 8\nLogical consistency: 7\nReasoning completeness: 6\n"
            "Conceptual accuracy: 12\nStrategy appropriateness: **5**",
        },
        name="a",
    )
    second = CannedJudge({"Score the model": "I would rather not."}, name="b")
    preds = {"mirage-1": {"text": "B", "reasoning": "The square is left."}, "mirage-3": {"text": "3"}}
    out = await mirage.judge(items, preds, [first, second])
    assert set(out) == {"mirage-1", "mirage-3"}  # mirage-2 has no prediction
    one = out["mirage-1"]
    assert one["step_match"] == {"pred": 3, "matched_pred": 2, "ref": 2, "matched_ref": 2}
    assert one["claim_match"] == {"pred": 10, "matched_pred": 10, "ref": 1, "matched_ref": 1}  # clamped
    assert one["lhs_scores"] == [[8, 7, 6, 10, 5]] * 2  # first judge × 2 references; the second failed twice
    assert one["judge_errors"] == 2
    assert out["mirage-3"] == {"step_match": None, "claim_match": None, "lhs_scores": [], "judge_errors": 0}
    assert "The square is left." in first.prompts[0] and "1. The left shape is a square." in first.prompts[0]
    merged = {k: {**preds[k], **v} for k, v in out.items()}
    scores = mirage.score(items, merged)
    assert scores["lhs_mean"] == pytest.approx(7.2) and scores["f_step"] == pytest.approx(0.8)
