"""HallusionBench on an excerpt of the real release (36 records of the current HallusionBench.json, 6 of
the 2023 one; data/README.md), unpacked as the README says: HallusionBench.json beside hallusion_bench/.

Expected figures are worked out by hand from the official utils.py rules (the version released with the
current HallusionBench.json): per question, per question group (category, subcategory, set_id,
question_id), per figure (VS without figure left out), easy = figure_id 0, hard = the rest; "uncertain"
counts as right only for a VS question without its figure.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faithproxy.benchmarks.evaluation.datasets import hallusionbench as hb
from faithproxy.benchmarks.evaluation.datasets.release import DatasetError
from tests.benchmarks.evaluation.releases import hallusionbench_2023, unpack


@pytest.fixture
def release_dir(tmp_path: Path) -> Path:
    return unpack("hallusionbench", tmp_path / "HallusionBench")


def test_reads_the_current_layout(release_dir: Path) -> None:
    release = hb.read(release_dir)
    assert release.problems == [] and release.splits == {"VS": 20, "VD": 16}
    items = {i.id: i for i in release.items}
    assert len(items) == 36
    chart = items["hb-VS-chart-3-1-0"]  # filename "./VS/chart/3_1.png", under hallusion_bench/ after unzipping
    assert chart.image == release_dir / "hallusion_bench" / "VS" / "chart" / "3_1.png"
    assert chart.answer == "no" and chart.extra["visual_input"] == "2"
    assert items["hb-VS-chart-3-0-0"].image is None  # visual_input 0: asked without a figure
    video = items["hb-VD-video-19-2-0"]
    assert video.image == release_dir / "hallusion_bench" / "VD" / "video" / "19_2.png"
    assert video.prompt == "According to the positive sequence of the images, Is he running counterclockwise? " \
                           "Answer in one sentence."  # fmt: skip


def test_reads_the_2023_layout(tmp_path: Path) -> None:
    root = tmp_path / "old"
    root.mkdir()
    items = hb.load(hallusionbench_2023(root))
    assert [i.id for i in items][:2] == ["hb-VD-illusion-0-0-0", "hb-VD-illusion-0-0-1"]
    assert items[0].image == root / "hallusion_bench" / "VD" / "illusion" / "0_0.png"


def test_images_missing_stop_before_any_question(release_dir: Path) -> None:
    """The failure of issue 19: the JSON found, its images not; never 28 silent wrong answers."""
    for png in (release_dir / "hallusion_bench").rglob("*.png"):
        png.unlink()
    with pytest.raises(DatasetError) as caught:
        hb.load(release_dir)
    message = str(caught.value)
    assert "28 record(s) cannot be used (missing_image 28)" in message
    assert str(release_dir / "hallusion_bench" / "VS" / "chart" / "3_1.png") in message
    release = hb.read(release_dir)
    assert len(release.items) == 8  # the questions asked without a figure can still be asked


PREDICTIONS = {
    "hb-VS-chart-3-0-3": "I cannot tell from the question alone.",  # uncertain without the figure: right
    "hb-VS-chart-5-1-0": "It is unclear from the chart.",  # uncertain with the figure: wrong
    "hb-VD-video-19-2-2": "Yes, they are in the correct order.",  # wrong
    "hb-VD-video-16-1-0": {"id": "hb-VD-video-16-1-0", "text": None, "error": "timeout"},  # failed: wrong
}


def answered(items: list[hb.Item]) -> dict[str, object]:
    return {i.id: PREDICTIONS.get(i.id, f"{i.answer.capitalize()}, clearly.") for i in items}


def test_official_figures(release_dir: Path) -> None:
    items = hb.load(release_dir)
    scores = hb.score(items, answered(items))
    # 36 questions, 3 wrong (the uncertain VS question without figure counts right)
    assert scores["aAcc"] == pytest.approx(33 / 36) and scores["questions"] == 36
    # 14 question groups; wrong: VS/5 q0, VD/16 q0, VD/19 q2
    assert (scores["question_pairs"], scores["qAcc"]) == (14, pytest.approx(11 / 14))
    # 8 figures (VS figure 0 has none); wrong: VS/5/1, VD/16/1, VD/19/2; mean share 7/8
    assert (scores["figures"], scores["fAcc"]) == (8, pytest.approx(5 / 8))
    assert scores["figure_score"] == pytest.approx(7 / 8)
    # easy: the 14 groups of figure_id 0, all right; hard: the 14 groups of the other figures, 3 wrong
    assert (scores["easy_pairs"], scores["easy_acc"]) == (14, 1.0)
    assert (scores["hard_pairs"], scores["hard_acc"]) == (14, pytest.approx(11 / 14))
    assert scores["by_category"]["VD"]["aAcc"] == pytest.approx(14 / 16)
    assert scores["by_category"]["VS"]["aAcc"] == pytest.approx(19 / 20)
    assert (scores["uncertain"], scores["missing"]) == (2, 1)
    assert hb.correct(items[3], "I cannot tell.") is True  # VS/3/0/q3 asked without its chart


def test_official_result_file_with_the_judges_codes(release_dir: Path) -> None:
    """HallusionBench_result.json: the release's records plus model_prediction; a *_gpt_check code
    (0 wrong, 1 right, 2 unclear) is the judge's verdict and wins over our reading of the text."""
    items = hb.load(release_dir)
    records = json.loads((release_dir / "HallusionBench.json").read_text())
    for record in records:
        record["model_prediction"] = "Yes"
        record["model_prediction_gpt_check"] = "1"
    records[3]["model_prediction_gpt_check"] = "2"  # VS/3/0 q3, no figure: uncertain counts right
    records[4]["model_prediction_gpt_check"] = "2"  # VS/3/1 q0, with figure: uncertain is wrong
    predictions = hb.from_official(records, items)
    assert predictions is not None and len(predictions) == 36
    scores = hb.score(items, predictions)
    assert scores["aAcc"] == pytest.approx(35 / 36) and scores["uncertain"] == 2
    assert hb.from_official([{"id": "x"}], items) is None


def test_unknown_values_and_repeated_keys_are_problems(release_dir: Path) -> None:
    records = json.loads((release_dir / "HallusionBench.json").read_text())
    records[0]["gt_answer"] = "2"
    records[1]["category"] = "VX"
    records.append(dict(records[5]))
    (release_dir / "HallusionBench.json").write_text(json.dumps(records))
    release = hb.read(release_dir)
    assert release.problem_counts == {"unknown_value": 2, "duplicate_record": 1}
    assert "gt_answer '2'" in release.problems[0].detail and "category 'VX'" in release.problems[1].detail
    assert len(release.items) == 34


def test_empty() -> None:
    scores = hb.score([], {})
    assert scores["aAcc"] is None and scores["qAcc"] is None and scores["fAcc"] is None
