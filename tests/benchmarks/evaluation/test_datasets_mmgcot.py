"""MM-GCoT on an excerpt of the real test files (18 records of dataset/GCoT_dataset_*_test.json;
data/README.md), with generated stand-ins for the Visual Genome images they name (64 × 48 pixels).

Expected figures follow the official eval.py, counted by hand per split: answer right when the reply's
answer, periods removed and lower-cased, equals the gold lower-cased; box parsed by `parse_bbox`,
converted (`--qwen`: pixels x1y1x2y2 over the original image size; `--internvl`: over 1000) to
normalised x, y, w, h; hit when IoU with the gold box > 0.5; consistency = CR / (CR + CM + WR).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faithproxy.benchmarks.evaluation.datasets import mmgcot
from tests.benchmarks.evaluation.releases import IMAGE_SIZE, unpack

W, H = IMAGE_SIZE


@pytest.fixture
def release_dir(tmp_path: Path) -> Path:
    return unpack("mmgcot", tmp_path / "MM-GCoT")


def pixels(box: tuple[float, ...]) -> str:
    """A gold x, y, w, h box as the pixel x1y1x2y2 a Qwen model writes, in its JSON."""
    x, y, w, h = box
    return json.dumps([{"bbox_2d": [x * W, y * H, (x + w) * W, (y + h) * H], "label": "it"}])


def test_reads_the_repository_layout(release_dir: Path) -> None:
    release = mmgcot.read(release_dir)
    assert release.problems == [] and release.splits == {"attributes": 7, "judge": 6, "objects": 5}
    first = release.items[0]
    assert first.id == "mmgcot-attributes-1" and first.answer == "Jeans"
    assert first.image == release_dir / "vg" / "VG_100K" / "2361224.jpg"
    assert first.extra["box"] == (0.210, 0.058, 0.435, 0.150)  # "[0.210, 0.058, 0.435, 0.150]": x, y, w, h
    assert (first.extra["width"], first.extra["height"]) == (W, H)
    assert first.prompt.startswith("What is the material of the hat") and "JSON format" in first.prompt
    assert [i.id for i in mmgcot.load(release_dir, split="judge")][:2] == ["mmgcot-judge-0", "mmgcot-judge-1"]


def test_repeated_ids_keep_apart(release_dir: Path) -> None:
    """Ids repeat within a split in the release (not a key): the k-th repeat is `-k`."""
    path = release_dir / "dataset" / "GCoT_dataset_objects_test.json"
    records = json.loads(path.read_text())
    path.write_text(json.dumps([*records, {**records[0], "question": "What else is on the table?"}]))
    ids = [i.id for i in mmgcot.load(release_dir, split="objects")]
    assert ids[0] == "mmgcot-objects-8" and ids[-1] == "mmgcot-objects-8-2"


def test_a_record_without_a_box_is_a_problem(release_dir: Path) -> None:
    path = release_dir / "dataset" / "GCoT_dataset_judge_test.json"
    records = json.loads(path.read_text())
    records[2]["coordinate"] = "unknown"
    path.write_text(json.dumps(records))
    release = mmgcot.read(release_dir, split="judge")
    assert release.problem_counts == {"unreadable_record": 1} and "'unknown'" in release.problems[0].detail


def test_official_figures_per_split(release_dir: Path) -> None:
    items = {i.id: i for i in mmgcot.load(release_dir)}
    box = {k: i.extra["box"] for k, i in items.items()}
    predictions = {
        # attributes: CR, CM, WR, WM (no box), and three unanswered (WM)
        "mmgcot-attributes-1": f"Answer: Jeans.\n{pixels(box['mmgcot-attributes-1'])}",
        "mmgcot-attributes-3": "Answer: white\n[0, 0, 5, 5]",
        "mmgcot-attributes-4": f"Answer: Blue\n{pixels(box['mmgcot-attributes-4'])}",
        "mmgcot-attributes-5": "Answer: Raw",
        # judge: one CR, five unanswered
        "mmgcot-judge-0": f"<think>The napkin is held.</think>{pixels(box['mmgcot-judge-0'])}\nAnswer: Yes",
    }
    scores = mmgcot.score(list(items.values()), predictions)
    attributes, judge, objects = (scores["by_split"][s] for s in ("attributes", "judge", "objects"))
    assert (attributes["CR"], attributes["CM"], attributes["WR"], attributes["WM"]) == (1, 1, 1, 4)
    assert attributes["answer_accuracy"] == pytest.approx(2 / 7)
    assert attributes["grounding_accuracy"] == pytest.approx(2 / 7)
    assert attributes["consistency"] == pytest.approx(1 / 3)
    assert (judge["answer_accuracy"], judge["consistency"]) == (pytest.approx(1 / 6), 1.0)
    assert (objects["answer_accuracy"], objects["consistency"]) == (0.0, None)  # CR + CM + WR = 0
    assert (scores["questions"], scores["answer_accuracy"]) == (18, pytest.approx(3 / 18))
    assert scores["consistency"] == 0.5  # CR 2 / (CR 2 + CM 1 + WR 1)
    assert (scores["no_box"], scores["missing"]) == (14, 13)


def test_internvl_and_raw_conventions_and_the_official_result_file(release_dir: Path) -> None:
    """eval.py's input: JSON lines with question_id, img, text (answer turn), coor (box turn)."""
    items = mmgcot.load(release_dir, split="attributes", box_format="internvl")
    rows = [
        {"question_id": 1, "img": "vg/VG_100K/2361224.jpg", "text": "Jeans.", "coor": "[210, 58, 645, 208]",
         "gt_text": "Jeans", "gt_coor": "[0.210, 0.058, 0.435, 0.150]"},
        {"question_id": 3, "img": "vg/VG_100K/2365383.jpg", "text": "Gray", "coor": "[38, 660, 454, 990]",
         "gt_text": "White", "gt_coor": "[0.038, 0.660, 0.416, 0.330]"},
    ]  # fmt: skip
    predictions = mmgcot.from_official(rows, items)
    assert predictions is not None and set(predictions) == {"mmgcot-attributes-1", "mmgcot-attributes-3"}
    scores = mmgcot.score([i for i in items if i.id in predictions], predictions)
    assert (scores["CR"], scores["WR"]) == (1, 1)  # 0-1000 x1y1x2y2 boxes equal to the gold ones
    raw = mmgcot.load(release_dir, split="attributes", box_format="raw")
    hit, read = mmgcot.hit(raw[0], "[0.210, 0.058, 0.435, 0.150]")  # the official default: already x, y, w, h
    assert hit and read


@pytest.mark.parametrize(
    ("text", "box"),
    [
        ('[{"bbox_2d": [10, 20, 30, 40], "label": "cup"}]', [10.0, 20.0, 30.0, 40.0]),
        ("(0.1, 0.2, 0.3, 0.4)", [0.1, 0.2, 0.3, 0.4]),  # no bracket: the text minus its ends
        ("[1, 2, 3]", [0.0, 0.0, 0.0, 0.0]),  # fewer than four numbers
        ("[-5, 2, 3, 4]", [-5.0, 2.0, 3.0, 4.0]),  # no match (minus sign): read whole, minus its ends
        (None, [0.0, 0.0, 0.0, 0.0]),
    ],
)
def test_parse_bbox_as_official(text: str | None, box: list[float]) -> None:
    assert mmgcot.parse_bbox(text) == box


def test_iou_threshold_is_strict_and_answers_compare_as_official() -> None:
    assert mmgcot.iou_xywh((0, 0, 1, 1), (0, 0, 1, 1)) == 1.0
    assert mmgcot.iou_xywh((0, 0, 1, 1), (0, 0, 1, 0.5)) == 0.5  # not a hit: > 0.5 is needed
    assert mmgcot.iou_xywh((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0
    assert mmgcot.answer_right("Lying on.", "Lying on") and mmgcot.answer_right("ipod", "IPod")
    assert not mmgcot.answer_right("a bowl", "Bowl")
    assert mmgcot.extract_answer('[{"bbox_2d": [1, 2, 3, 4]}]\nAnswer: Bowl.') == "Bowl."
    assert mmgcot.extract_answer("The bowl.\n[1, 2, 3, 4]") == "The bowl."
