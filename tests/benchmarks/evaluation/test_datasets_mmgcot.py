"""MM-GCoT: answer and grounding accuracy, consistency, box conventions and the three prompt settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from faithproxy.benchmarks.evaluation.datasets import mmgcot

GOLD = [20, 10, 120, 60]  # pixels of a 200 × 100 image


def write_mmgcot(root: Path, answers=("red", "two", "cat", "3.5", "yes"), with_size: bool = True) -> Path:
    (root / "images").mkdir(parents=True)
    Image.new("RGB", (200, 100)).save(root / "images" / "a.jpg")
    records = []
    for k, answer in enumerate(answers):
        record = {"id": k + 1, "image": "images/a.jpg", "question": f"Question {k + 1}?", "answer": answer,
                  "bbox": GOLD}  # fmt: skip
        if with_size:
            record |= {"width": 200, "height": 100}
        records.append(record)
    (root / "mmgcot_test.json").write_text(json.dumps(records))
    return root


def test_settings_and_sizes(tmp_path: Path) -> None:
    write_mmgcot(tmp_path, with_size=False)
    for setting in mmgcot.SETTINGS:
        item = mmgcot.load(tmp_path, setting=setting)[0]
        assert item.prompt == f"Question 1?\n{mmgcot.SETTINGS[setting]}"
        assert (item.extra["width"], item.extra["height"]) == (200, 100)  # read from the image
        assert item.extra["boxes"] == [tuple(map(float, GOLD))] and item.answer == "red"
    assert "Step k:" in mmgcot.SETTINGS["grounding_cot"]
    with pytest.raises(ValueError, match="setting"):
        mmgcot.load(tmp_path, setting="cot")
    with pytest.raises(ValueError, match="box_format"):
        mmgcot.load(tmp_path, box_format="yolo")


def test_answer_grounding_and_consistency(tmp_path: Path) -> None:
    items = mmgcot.load(write_mmgcot(tmp_path), model_width="200", model_height="100")  # boxes in image pixels
    predictions = {
        "mmgcot-1": {"text": "Step 1: the ball is at [20, 10, 120, 60].\nAnswer: Red."},  # right, hit
        "mmgcot-2": {"text": "Step 1: the cups are at [0, 0, 10, 10].\nAnswer: two"},  # right, miss
        "mmgcot-3": {"text": "Step 1: the animal is at [25, 10, 125, 60].\nAnswer: dog"},  # wrong, hit (IoU .905)
        "mmgcot-4": {"text": "No box here. The answer is 3.5"},  # right (periods dropped), no box
        # mmgcot-5 missing: wrong, no box
    }
    scores = mmgcot.score(items, predictions)
    assert scores == {
        "questions": 5,
        "answer_accuracy": pytest.approx(3 / 5),
        "grounding_accuracy": pytest.approx(2 / 5),
        "consistency": pytest.approx(1 / 4),
        "CR": 1,
        "CM": 2,
        "WR": 1,
        "WM": 1,
        "no_box": 2,
    }
    assert [mmgcot.correct(i, predictions.get(i.id)) for i in items] == [True, True, False, True, False]


def test_boxes_in_the_reasoning_and_first_box_for_grounding_first(tmp_path: Path) -> None:
    write_mmgcot(tmp_path, answers=("red",))
    reply = "<think>Step 1: the ball is at [20, 10, 120, 60]. Step 2: the bat is at [0, 0, 5, 5].</think>\nAnswer: red"
    cot = mmgcot.load(tmp_path)
    assert mmgcot.score(cot, {"mmgcot-1": reply})["CM"] == 1  # the last box (the bat) misses
    first = mmgcot.load(tmp_path, setting="grounding_first")
    assert mmgcot.score(first, {"mmgcot-1": reply})["CR"] == 1


@pytest.mark.parametrize(
    ("box_format", "box", "model_size"),
    [
        ("qwen25", (20, 10, 120, 60), None),
        ("qwen25", (40, 20, 240, 120), (400, 200)),  # pixels of the resized input
        ("qwen2", (100, 100, 600, 600), None),
        ("internvl", (100, 100, 600, 600), None),
        ("norm_xyxy", (0.1, 0.1, 0.6, 0.6), None),
        ("norm_xywh", (0.1, 0.1, 0.5, 0.5), None),
    ],
)
def test_box_conventions(box_format: str, box: tuple[float, ...], model_size: tuple[int, int] | None) -> None:
    assert mmgcot.to_pixels(box, box_format, 200, 100, model_size) == pytest.approx(GOLD)


@pytest.mark.parametrize(
    ("size", "limits", "expected"),
    [
        ((200, 100), {}, (196, 112)),  # sides rounded to multiples of 28
        ((2000, 1000), {"max_pixels": 78400}, (392, 196)),  # scaled down into the budget
        ((20, 10), {}, (84, 56)),  # scaled up to the minimum
    ],
)
def test_qwen_resize(size: tuple[int, int], limits: dict[str, int], expected: tuple[int, int]) -> None:
    assert mmgcot.qwen_resized(*size, **limits) == expected


def test_qwen25_boxes_are_in_pixels_of_the_resized_image(tmp_path: Path) -> None:
    write_mmgcot(tmp_path, answers=("red",))
    (item,) = mmgcot.load(tmp_path)
    assert item.extra["model_size"] == (196, 112)
    # the gold box as the model sees it: x scaled by 196/200, y by 112/100
    assert mmgcot.iou(mmgcot.to_pixels((19.6, 11.2, 117.6, 67.2), "qwen25", 200, 100, (196, 112)), GOLD) == (
        pytest.approx(1.0)
    )
    assert mmgcot.score([item], {"mmgcot-1": "Answer: red [19.6, 11.2, 117.6, 67.2]"})["CR"] == 1
    small = mmgcot.load(tmp_path, qwen_max_pixels=str(28 * 28 * 4), qwen_min_pixels="784")[0]
    assert small.extra["model_size"] == (56, 28)
    given = mmgcot.load(tmp_path, model_width="400", model_height="200")[0]
    assert given.extra["model_size"] == (400, 200)


def test_iou_threshold_is_strict(tmp_path: Path) -> None:
    assert mmgcot.iou((0, 0, 100, 100), (0, 0, 100, 50)) == 0.5
    assert mmgcot.iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0
    assert mmgcot.iou((0, 0, 0, 10), (0, 0, 0, 10)) == 0.0  # degenerate
    assert mmgcot.iou((120, 60, 20, 10), tuple(GOLD)) == 1.0  # corners in any order
    write_mmgcot(tmp_path, answers=("red",))
    items = mmgcot.load(tmp_path, box_format="internvl")
    # [100, 100, 600, 350] on the 0-1000 grid is (20, 10, 120, 35): IoU exactly 0.5, not a hit
    assert mmgcot.score(items, {"mmgcot-1": "Answer: red [100, 100, 600, 350]"})["CM"] == 1
    assert mmgcot.score(items, {"mmgcot-1": "Answer: red [100, 100, 600, 600]"})["CR"] == 1


def test_empty_and_answer_extraction() -> None:
    scores = mmgcot.score([], {})
    assert scores["answer_accuracy"] is None and scores["consistency"] is None
    assert mmgcot.extract_answer("Step 1: x is at [1, 2, 3, 4]\nThe dog [1, 2, 3, 4]") == "The dog"
    assert mmgcot.extract_answer("<think>unfinished") is None
    assert mmgcot.normalize_answer("  Mr. Smith. ") == "mr smith"


_coord = st.floats(min_value=0, max_value=1000, allow_nan=False)


@given(a=st.tuples(_coord, _coord, _coord, _coord), b=st.tuples(_coord, _coord, _coord, _coord))
def test_iou_is_symmetric_and_bounded(a: tuple[float, ...], b: tuple[float, ...]) -> None:
    value = mmgcot.iou(a, b)
    assert 0.0 <= value <= 1.0 + 1e-9
    assert value == pytest.approx(mmgcot.iou(b, a))
    if abs(a[2] - a[0]) > 1e-3 and abs(a[3] - a[1]) > 1e-3:
        assert mmgcot.iou(a, a) == pytest.approx(1.0)
