"""MIRAGE: mirage.tsv as released (base64 images or file names, the columns the official benchmark_eval.py reads), the
official answer rules (MIX: multiple choice, approximate within a 0.95 ratio, exact numbers; non-numeric
answers score 0), accuracy per normalized_classification, and the judge's F1 and LHS (1-5).

The TSV's records (data/mirage/records.jsonl) follow the release's columns; their values are ours: the
release is on the hub only (data/README.md). Expected figures are counted by hand from the official rules.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from faithproxy.benchmarks.evaluation.datasets import mirage
from faithproxy.benchmarks.evaluation.datasets.release import IMAGE_CACHE
from tests.benchmarks.canned_judge import CannedJudge
from tests.benchmarks.evaluation.releases import DATA, png, read_jsonl, unpack
from tests.benchmarks.evaluation.releases import mirage as write_mirage


@pytest.fixture
def release_dir(tmp_path: Path) -> Path:
    return unpack("mirage", tmp_path / "mirage")


def test_reads_the_tsv_with_base64_images(release_dir: Path) -> None:
    release = mirage.read(release_dir)
    assert release.problems == [] and release.notes == []
    assert release.splits == {"multi_choice": 2, "approx": 2, "free_form": 3}
    first = release.items[0]
    assert first.id == "mirage-0" and first.answer == "B"
    assert first.options == ("the circle", "the square", "the triangle")
    assert first.prompt == "Which shape has the largest area?\nA. the circle\nB. the square\nC. the triangle"
    assert first.image == release_dir / IMAGE_CACHE / "mirage-0.png" and first.image.read_bytes() == png("mirage-0")
    assert first.extra["classification"] == "Geometry" and len(first.extra["references"]) == 3


def test_reads_image_file_names_as_the_official_reader_does(tmp_path: Path) -> None:
    # The hub ships mirage_images.zip beside mirage.tsv, and a VLMEvalKit adapter that pins the released
    # TSV's md5 joins each `image` cell to the unzipped folder; the official to_base64_image (VIC
    # utils/file.py) takes a cell that names an existing file before trying base64. Both layouts read.
    root = write_mirage(tmp_path / "files", images="files")
    release = mirage.read(root)
    assert release.problems == [] and len(release.items) == 7
    assert release.items[0].image == root / "images" / "0.png"
    assert all(item.image.parent == root / "images" for item in release.items)  # read in place, not copied

    (root / "images" / "3.png").unlink()  # the zip not (fully) unpacked
    records = read_jsonl(DATA / "mirage" / "records.jsonl")
    url = tmp_path / "url"
    write_mirage(url, records[:1])
    cell = base64.b64encode(png("mirage-0")).decode("ascii")
    (url / "mirage.tsv").write_text((url / "mirage.tsv").read_text().replace(cell, "https://x.test/0.jpg"))
    missing, remote = mirage.read(root), mirage.read(url)
    assert [(p.kind, p.path) for p in missing.problems] == [("missing_image", str(root / "images" / "3.png"))]
    assert [p.kind for p in remote.problems] == ["missing_image"] and "URL" in remote.problems[0].detail


def test_bad_rows_are_problems_and_unmatchable_answers_are_notes(tmp_path: Path) -> None:
    records = read_jsonl(DATA / "mirage" / "records.jsonl")
    records[1]["normalized_classification"] = "Numeric Commonsense"  # the official score() has no such class
    records[2]["choices"] = "[unclosed"
    records[5]["answer"] = "add 3"  # the option's text: the official letter check can never match it
    root = write_mirage(tmp_path, records)
    release = mirage.read(root)
    assert release.problem_counts == {"unknown_value": 1, "unreadable_record": 1}
    assert "'Numeric Commonsense'" in release.problems[0].detail
    assert [n.kind for n in release.notes] == ["unmatchable_answer"] and len(release.items) == 5


REPLIES = {
    "mirage-0": "The square is 4 by 4. <answer>B</answer>",  # multiple choice, right
    "mirage-1": "It reaches about 12. <answer>12.0</answer>",  # approx: 12.0 / 12.5 = 0.96 >= 0.95
    "mirage-2": "Two rows of seven. <answer>14</answer>",  # exact integer
    "mirage-3": "The peak: <answer>[2007, 2008]</answer>",  # a list, equal
    "mirage-4": "2x = 8\nx = 4",  # approx, integer gold 4, last number of the final line
    "mirage-5": "<answer>A</answer>",  # multiple choice, wrong
    "mirage-6": "<answer>oxygen</answer>",  # non-numeric gold: the official scorer gives 0
}


def test_official_answer_rules(release_dir: Path) -> None:
    items = mirage.load(release_dir)
    scores = mirage.score(items, REPLIES)
    assert scores["accuracy"] == pytest.approx(5 / 7)
    assert {c: v["accuracy"] for c, v in scores["by_class"].items()} == {
        "Algebraic": 1.0, "Arithmetic": 1.0, "Geometry": 1.0, "Logical": 0.0, "Scientific": 0.0, "Spatial": 1.0,
        "Statistical": 1.0,
    }  # fmt: skip
    by_type = {t: (v["correct"], v["total"]) for t, v in scores["by_question_type"].items()}
    assert by_type == {"approx": (2, 2), "free_form": (2, 3), "multi_choice": (1, 2)}
    assert scores["claim_f1"] is None and scores["lhs_mean"] is None  # nothing judged


@pytest.mark.parametrize(
    ("answer", "parsed", "approx", "right"),
    [
        ("12.5", "11.5", True, False),  # 0.92
        ("12.5", "13.1", True, True),  # 12.5 / 13.1 = 0.954
        ("14", "14.0", False, False),  # an integer gold needs an integer reply (int("14.0") fails)
        ("14", "14", False, True),
        ("0", "0", True, True),  # equal; the official ratio would divide by zero
        ("0", "1", True, False),
        ("-5", "5", True, False),  # opposite signs: the ratio is negative
        ("[1, 2]", "[1, 2]", True, True),
        ("[1, 2]", "[1, 3]", True, False),  # lists: equal only, even when approximate
        ("oxygen", "oxygen", False, False),  # non-numeric gold: 0
        ("4", None, True, False),
    ],
)
def test_numeric_rules(answer: str, parsed: str | None, approx: bool, right: bool) -> None:
    assert mirage._numeric_right(parsed, answer, approx) is right


def test_reply_number() -> None:
    assert mirage.reply_number("<think>maybe 3</think>So <answer>1,250 m</answer>", "int") == "1250"
    assert mirage.reply_number("The years are [2007, 2008].", "list") == "[2007, 2008]"
    assert mirage.reply_number("No idea.", "float") is None


async def test_judge_f1_and_lhs(release_dir: Path) -> None:
    items = mirage.load(release_dir)[:2]
    match = "<pred_match>MATCH,REASONABLE,CONFLICT</pred_match>\n<gt_match>MATCH,CONFLICT</gt_match>"
    lhs = ('{"Factual Accuracy": {"score": 4, "explanation": "."}, "Logical Consistency": {"score": 4}, '
           '"Reasoning Completeness": {"score": 5}, "Conceptual Reasoning Accuracy": {"score": 3}, '
           '"Strategy Appropriateness": {"score": 9}}')  # fmt: skip
    first = CannedJudge({"atomic claims": match, "atomic steps": match, "Score the model": lhs}, name="a")
    second = CannedJudge({"Score the model": "No scores today."}, name="b")
    predictions = {"mirage-0": {"text": "<answer>B</answer>", "reasoning": "The square's side is 4."}}
    out = await mirage.judge(items, predictions, [first, second])
    assert set(out) == {"mirage-0"}  # mirage-1 has no prediction
    one = out["mirage-0"]
    assert one["claim_match"] == {"pred": ["MATCH", "REASONABLE", "CONFLICT"], "gt": ["MATCH", "CONFLICT"]}
    assert one["lhs_scores"] == [[4.0, 4.0, 5.0, 3.0, 5.0]] * 3  # clamped to 5; 3 references, first judge
    assert one["judge_errors"] == 3  # the second judge, 3 times
    prompt = next(p for p in first.prompts if "atomic steps" in p)
    assert "Here is a multiple choice question: " in prompt and "<step>The square's side is 4, so" in prompt
    scores = mirage.score(items, {k: {**predictions[k], **v} for k, v in out.items()})
    # official calculate_metrics: precision (MATCH + REASONABLE) / 3, recall MATCH / 2, F1 of the two
    assert scores["claim_precision"] == pytest.approx(2 / 3) and scores["claim_recall"] == 0.5
    assert scores["claim_f1"] == pytest.approx(4 / 7) and scores["step_f1"] == pytest.approx(4 / 7)
    assert scores["lhs_mean"] == pytest.approx(4.2) and scores["lhs_std"] == 0.0 and scores["lhs_judged"] == 1


def test_parse_match_needs_both_blocks() -> None:
    assert mirage.parse_match("<pred_match>MATCH</pred_match>") is None
    assert mirage.prf({"pred": [], "gt": []}) == (0.0, 0.0, 0.0)


def test_official_table_with_its_verdicts(release_dir: Path) -> None:
    items = mirage.load(release_dir)
    rows = [{"index": "0", "response": "whatever", "sign": "1"}, {"index": "5", "response": "<answer>C</answer>"}]
    predictions = mirage.from_official(rows, items)
    assert predictions is not None
    scores = mirage.score([i for i in items if i.id in predictions], predictions)
    assert scores["accuracy"] == 1.0  # the extractor's sign for 0, our reading (C, right) for 5


def test_empty() -> None:
    scores = mirage.score([], {})
    assert scores["accuracy"] is None and scores["lhs_mean"] is None and scores["claim_f1"] is None
