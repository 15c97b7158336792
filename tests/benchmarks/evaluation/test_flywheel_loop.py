"""The loop's bookkeeping: pairs scored by ShapesWorld's ground truth, intervals over chains, and the
confidence filter on flags that carry one."""

from __future__ import annotations

from typing import Any

import pytest

from faithproxy.benchmarks.evaluation.flywheel_loop import _items, pair_truth, paired_difference, with_intervals
from faithproxy.benchmarks.shapesworld.export import image_sha256
from faithproxy.flywheel.images import ImageIndex
from faithproxy.flywheel.pairs import TRAIN, ExportOptions, export_pairs, pair_row
from faithproxy.flywheel.records import Recorded, RecordedStep


def _recorded(item: Any, steps: tuple[RecordedStep, ...]) -> Recorded:
    return Recorded(request_id=item.id, model="m", detector="judge", judge="learned", question=item.question.prompt,
                    image_hashes=(image_sha256(item.scene),), steps=steps, source="trace",
                    image_urls={image_sha256(item.scene): "data:image/png;base64,AA=="})  # fmt: skip


def _step(index: int, text: str, original: str, confidence: float | None) -> RecordedStep:
    return RecordedStep(index=index, channel="content", kind="perception", text=text, original_text=original,
                        verdict="faithful", detected="unfaithful", confidence=confidence, attempts=1)  # fmt: skip


def test_pairs_are_scored_by_the_scenes_truth() -> None:
    first, second = _items(997, 2)
    n1, n2 = len(first.scene.objects), len(second.scene.objects)
    right = _step(0, f"There are {n1} objects in the image.", f"There are {n1 + 1} objects in the image.", 0.9)
    inverted = _step(0, f"There are {n2 + 2} objects in the image.", f"There are {n2} objects in the image.", 0.9)
    rows = [pair_row(_recorded(first, (right,)), right, ["x"], TRAIN)]
    rows.append(pair_row(_recorded(second, (inverted,)), inverted, ["x"], TRAIN))
    report = pair_truth(rows, [(997, 2)])
    assert report["right"] == 1 and report["outcomes"] == {
        "chosen_false_rejected_true": 1,
        "chosen_true_rejected_false": 1,
    }


def test_min_confidence_keeps_the_flags_the_detector_was_sure_of() -> None:
    (item,) = _items(997, 1)
    steps = (_step(0, "A.", "B.", 0.4), _step(1, "C.", "D.", 0.95), _step(2, "E.", "F.", None))
    exported = export_pairs([_recorded(item, steps)], ImageIndex(), ExportOptions(min_confidence=0.9))
    assert [p["metadata"]["chosen_step"] for p in exported.pairs[TRAIN]] == ["C."]
    assert exported.counts["left_out_confidence"] == 2
    # the chain before a step falls back to the earlier steps when the record has no delivered text
    assert exported.pairs[TRAIN][0]["metadata"]["prefix"] == "A. "


def test_intervals_hold_the_point_and_pair_the_chains() -> None:
    base = [{"steps": 4, "false": i % 2, "correct": i % 3 == 0} for i in range(60)]
    tuned = [dict(r, false=0) for r in base]
    figures = with_intervals(base)
    low, high = figures["upr"]["ci95"]
    assert figures["upr"]["value"] == pytest.approx(30 / 240) and low <= figures["upr"]["value"] <= high
    diff = paired_difference(base, tuned)
    assert diff["upr"]["value"] == pytest.approx(-30 / 240) and diff["upr"]["ci95"][1] < 0
    assert diff["accuracy"]["value"] == 0.0 and diff["accuracy"]["ci95"] == [0.0, 0.0]
