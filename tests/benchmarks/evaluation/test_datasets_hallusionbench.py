"""HallusionBench loader and aAcc/qAcc/fAcc with the easy/hard split, on a fixture in the release layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from faithproxy.benchmarks.evaluation.datasets import hallusionbench as hb


def record(cat, sub, set_id, fig, qid, visual, gold, question="Is the left line longer?"):
    filename = None if visual == "0" else f"./hallusion_bench/{cat}/{sub}/{set_id}_{fig}.png"
    return {
        "category": cat, "subcategory": sub, "visual_input": visual, "set_id": set_id, "figure_id": fig,
        "sample_note": "lines", "question_id": qid, "question": question, "gt_answer_details": "",
        "gt_answer": gold, "filename": filename,
    }  # fmt: skip


RECORDS = [
    record("VD", "illusion", "0", "0", "0", "1", "1"),  # a
    record("VD", "illusion", "0", "1", "0", "2", "0"),  # b: the edited figure
    record("VD", "illusion", "0", "0", "0", "0", "1"),  # c: no image
    record("VD", "illusion", "0", "0", "1", "1", "1", question="Are the lines parallel?"),  # d
    record("VD", "illusion", "0", "1", "1", "2", "1", question="Are the lines parallel?"),  # e
    record("VS", "chart", "1", "0", "0", "1", "0", question="Is the 2020 bar the tallest?"),  # f
]


def write_hb(root: Path) -> Path:
    (root / "HallusionBench.json").write_text(json.dumps(RECORDS))
    for r in RECORDS:
        if r["filename"]:
            path = root / r["filename"].removeprefix("./")
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (0, 0, 255)).save(path)
    return root


def ids(items):
    return {k: i.id for k, i in zip("abcdef", items, strict=True)}


def test_loads_the_release_layout(tmp_path: Path) -> None:
    items = hb.load(write_hb(tmp_path), instruction="Answer yes or no.")
    assert len({i.id for i in items}) == 6
    a, b, c, *_ = items
    assert a.image == tmp_path / "hallusion_bench/VD/illusion/0_0.png" and a.image.exists()
    assert c.image is None and c.extra["figure"] is None
    assert (a.answer, b.answer) == ("yes", "no")
    assert [i.extra["split"] for i in items] == ["easy", "hard", "no_visual", "easy", "hard", "easy"]
    assert a.prompt == "Is the left line longer? Answer yes or no."
    assert a.extra["question_group"] == b.extra["question_group"] == c.extra["question_group"]


def test_question_and_figure_accuracy(tmp_path: Path) -> None:
    items = hb.load(write_hb(tmp_path))
    k = ids(items)
    predictions = {
        k["a"]: "Yes.",
        k["b"]: "Yes, it is longer.",  # wrong: the edited figure says no
        k["c"]: r"\boxed{yes}",
        k["d"]: {"text": "The answer is yes."},
        k["e"]: {"text": "Maybe."},  # unparseable
        k["f"]: {"text": "No.", "reasoning": "At first glance yes, but 2019 is taller."},
    }
    scores = hb.score(items, predictions)
    assert scores["aAcc"] == pytest.approx(4 / 6)
    assert scores["qAcc"] == pytest.approx(1 / 3)  # only the VS group is all right
    assert scores["fAcc"] == pytest.approx(2 / 3)  # VD figure 0 and the VS figure
    assert (scores["easy_aAcc"], scores["hard_aAcc"], scores["no_visual_aAcc"]) == (1.0, 0.0, 1.0)
    assert (scores["easy_questions"], scores["hard_questions"], scores["no_visual_questions"]) == (3, 2, 1)
    assert (scores["question_groups"], scores["figures"], scores["unparsed"]) == (3, 3, 1)
    assert [hb.correct(i, predictions[i.id]) for i in items] == [True, False, True, True, False, True]


def test_empty_and_unanswered(tmp_path: Path) -> None:
    empty = hb.score([], {})
    assert empty["aAcc"] is None and empty["qAcc"] is None and empty["hard_aAcc"] is None
    scores = hb.score(hb.load(write_hb(tmp_path)), {})
    assert scores["aAcc"] == 0.0 and scores["fAcc"] == 0.0 and scores["unparsed"] == 6


def test_a_repeated_key_keeps_both_records(tmp_path: Path) -> None:
    (tmp_path / "HallusionBench.json").write_text(json.dumps([RECORDS[2], RECORDS[2]]))
    assert [i.id for i in hb.load(tmp_path)] == ["hb-VD-illusion-0-0-0-0", "hb-VD-illusion-0-0-0-0-2"]


def test_rejects_an_unknown_gold(tmp_path: Path) -> None:
    (tmp_path / "HallusionBench.json").write_text(json.dumps([{**RECORDS[0], "gt_answer": "2"}]))
    with pytest.raises(ValueError, match="gt_answer"):
        hb.load(tmp_path)
