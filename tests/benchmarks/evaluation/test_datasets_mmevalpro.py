"""MMEvalPro loader (the hub's Parquet release, and JSON lines) and genuine accuracy over triplets."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from faithproxy.benchmarks.evaluation.datasets import mmevalpro


def png(colour=(255, 0, 0)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(out, format="PNG")
    return out.getvalue()


def row(index, triplet, eval_type, answer, choices=("yes", "no", "unsure"), source="MMMU"):
    return {
        "index": index, "triplet_id": triplet, "eval_type": eval_type, "source": source,
        "question": f"Question {index}?", "choices": list(choices), "answer": answer,
        "question_category": "physics",
    }  # fmt: skip


ROWS = [
    row(1, 1, "Origin", "B"),
    row(2, 1, "Perception", "A"),
    row(3, 1, "Knowledge", "cat", choices=("dog", "cat")),  # the answer as option text
    row(4, 2, "Origin", "B"),
    row(5, 2, "Perception", "A"),
    row(6, 2, "Knowledge", "A", choices=("dog", "cat")),
    row(7, 3, "Origin", "C"),
    row(8, 3, "Perception", "B", source="ScienceQA"),  # triplet 3 has no knowledge question
]


def write_parquet(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    rows = [{**r, "image": {"bytes": png((r["index"] * 20, 0, 0)), "path": f"{r['index']}.png"}} for r in ROWS]
    pq.write_table(pa.Table.from_pylist(rows[:4]), root / "data" / "MMMU-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[4:]), root / "data" / "MMMU-00001-of-00002.parquet")
    return root


def test_loads_parquet_and_extracts_images_once(tmp_path: Path) -> None:
    items = mmevalpro.load(write_parquet(tmp_path))
    assert [i.id for i in items] == [f"mmevalpro-{n}" for n in range(1, 9)]
    assert items[2].answer == "B" and items[2].options == ("dog", "cat")
    assert items[0].prompt == "Question 1? Options: A. yes B. no C. unsure"
    assert items[0].image.read_bytes() == png((20, 0, 0))
    assert items[0].image.parent == tmp_path / ".faithproxy-images"
    assert [i.extra["eval_type"] for i in items[:3]] == ["Origin", "Perception", "Knowledge"]
    again = mmevalpro.load(tmp_path)  # the extracted images are not read as data
    assert [i.image for i in again] == [i.image for i in items]


def test_jsonl_and_source_filter(tmp_path: Path) -> None:
    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    lines = [json.dumps({**r, "image": "x.png"}) for r in ROWS]
    (tmp_path / "MMEvalPro.jsonl").write_text("\n".join(lines) + "\n")
    items = mmevalpro.load(tmp_path, source="scienceqa")
    assert [i.id for i in items] == ["mmevalpro-8"] and items[0].image == tmp_path / "x.png"


PREDICTIONS = {
    "mmevalpro-1": "The answer is B.",
    "mmevalpro-2": {"text": "(a)"},
    "mmevalpro-3": {"text": "The answer is cat."},
    "mmevalpro-4": {"text": "B"},
    "mmevalpro-5": {"text": r"\boxed{C}"},  # wrong: triplet 2 is not genuine
    "mmevalpro-6": {"text": "A. dog"},
    "mmevalpro-7": {"text": "Hard to say."},  # unparseable
    "mmevalpro-8": {"text": "B"},
}


def test_genuine_accuracy_needs_the_whole_triplet(tmp_path: Path) -> None:
    scores = mmevalpro.score(mmevalpro.load(write_parquet(tmp_path)), PREDICTIONS)
    assert scores == {
        "questions": 8,
        "triplets": 2,
        "genuine_accuracy": 0.5,
        "average_accuracy": pytest.approx(6 / 8),
        "origin_accuracy": pytest.approx(2 / 3),
        "perception_accuracy": pytest.approx(2 / 3),
        "knowledge_accuracy": 1.0,
        "perception_consistency": 0.5,  # triplets 1 and 2 have the origin right; only 1 the perception
        "knowledge_consistency": 1.0,
        "incomplete_triplets": 1,
        "unparsed": 1,
    }
    items = mmevalpro.load(tmp_path)
    assert [mmevalpro.correct(i, PREDICTIONS[i.id]) for i in items] == [True] * 4 + [False, True, False, True]


def test_empty_and_bad_answers(tmp_path: Path) -> None:
    empty = mmevalpro.score([], {})
    assert empty["genuine_accuracy"] is None and empty["knowledge_accuracy"] is None
    assert empty["perception_consistency"] is None
    (tmp_path / "MMEvalPro.jsonl").write_text(json.dumps(row(1, 1, "Origin", "maybe")))
    with pytest.raises(ValueError, match="neither a letter"):
        mmevalpro.load(tmp_path)
