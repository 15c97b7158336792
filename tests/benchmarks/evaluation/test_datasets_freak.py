"""FREAK: the hub release (Parquet, the columns of the official build/upload.py), the 6 official option
orders, the official letter reading, Acc and HalluRate, and the free-form judge.

The excerpt's records (data/freak/records.jsonl) follow the release's schema; the teapot and kick-drum
questions are the official prompt_adapter.py's examples, the others are ours: the release's records are
on the hub only (data/README.md). Expected figures follow eval/evaluate.py's rules, counted by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.benchmarks.evaluation.datasets import Item, freak
from faithproxy.faithcore.errors import DetectorError
from tests.benchmarks.canned_judge import CannedJudge
from tests.benchmarks.evaluation.releases import DATA, png, read_jsonl, unpack, write_parquet


@pytest.fixture
def release_dir(tmp_path: Path) -> Path:
    return unpack("freak", tmp_path / "freak")


def test_reads_the_hub_release(release_dir: Path) -> None:
    release = freak.read(release_dir)
    assert release.problems == [] and release.splits == {"mcq": 3, "fib": 3}
    assert len(release.items) == 3 * 6 + 3
    o = {i.id: i for i in release.items}
    # the official permutations: option 0 (correct) and 1 (commonsense) land on these letters
    assert [(o[f"freak-1-o{k}"].answer, o[f"freak-1-o{k}"].extra["commonsense_letter"]) for k in range(6)] == [
        ("A", "B"), ("A", "C"), ("B", "A"), ("C", "A"), ("B", "C"), ("C", "B"),
    ]  # fmt: skip
    third = o["freak-1-o2"]
    assert third.options == ("Yes, on the side.", "Not visible / Can't see.", "Yes, arched over the top.",
                             "The correct answer is not listed.")  # fmt: skip
    assert "Question: Does the Teapot in the picture have a handle?" in third.prompt
    assert "\nB. Not visible / Can't see.\n" in third.prompt and third.prompt.endswith("Your answer:")
    drum = o["freak-2-open"]
    assert drum.extra["correct_text"] == "A circle, but the bottom is #straight#" and drum.options == ()
    assert drum.image is not None and drum.image.read_bytes() == png("freak-2")


def test_modes(release_dir: Path) -> None:
    assert {i.extra["format"] for i in freak.load(release_dir, mode="mcq")} == {"mcq"}
    assert [i.id for i in freak.load(release_dir, mode="open")] == ["freak-2-open", "freak-4-open", "freak-6-open"]
    with pytest.raises(ValueError, match="mode"):
        freak.load(release_dir, mode="free")


def test_bad_records_are_problems(tmp_path: Path) -> None:
    records = read_jsonl(DATA / "freak" / "records.jsonl")
    records[0]["options"] = records[0]["options"][:3]
    records[1]["type"] = "open"
    records[3]["ground_truth"] = None
    rows = [{**r, "image": {"bytes": png(str(r["id"])), "path": None}} for r in records]
    rows[4]["image"] = None
    write_parquet(tmp_path / "data" / "test-00000-of-00001.parquet", rows)
    release = freak.read(tmp_path)
    assert release.problem_counts == {"unreadable_record": 2, "unknown_value": 1, "missing_image": 1}
    assert [i.id for i in release.items] == [*(f"freak-3-o{k}" for k in range(6)), "freak-6-open"]


@pytest.mark.parametrize(
    ("reply", "letter", "found"),
    [
        ("A", "A", True),
        ("<answer>C</answer> because the handle is hidden", "C", True),
        ("The answer is B.", "B", True),  # "B." in the reply
        ("I would go with option C", "C", True),  # the last character
        ("<think>It looks like A.</think>B", "B", True),  # only the part after the reasoning
        ("B) on the side", "D", False),  # the official rules do not read this dress: D
        ("Not sure", "D", False),
        ("", "D", False),  # the official script fails on an empty reply; D here
    ],
)
def test_official_letter_reading(reply: str, letter: str, found: bool) -> None:
    assert freak.official_choice(reply) == (letter, found)


async def test_official_figures(release_dir: Path) -> None:
    items = freak.load(release_dir)
    mcq = {i.id: i for i in items if i.extra["format"] == "mcq"}
    predictions: dict[str, object] = {}
    # question 1: right in orders 0-2, the commonsense option in orders 3-4, D in order 5
    for k in range(3):
        predictions[f"freak-1-o{k}"] = mcq[f"freak-1-o{k}"].answer
    for k in (3, 4):
        predictions[f"freak-1-o{k}"] = f"<answer>{mcq[f'freak-1-o{k}'].extra['commonsense_letter']}</answer>"
    predictions["freak-1-o5"] = "D"
    # question 3: right in every order; question 5: every request failed (D by the fallback, and errors)
    predictions.update({f"freak-3-o{k}": mcq[f"freak-3-o{k}"].answer for k in range(6)})
    predictions.update({f"freak-5-o{k}": {"id": f"freak-5-o{k}", "error": "timeout"} for k in range(6)})
    # free form: 2 judged right, 4 the typical error, 6 not judged
    predictions["freak-2-open"] = {"text": "Round with a flat bottom.", "judgement": "correct"}
    predictions["freak-4-open"] = {"text": "Yellow.", "judgement": "commonsense_error"}
    predictions["freak-6-open"] = {"text": "In the middle."}
    scores = freak.score(items, predictions)
    assert scores["questions"] == 3 and scores["mcq_items"] == 18
    assert scores["accuracy"] == pytest.approx((3 / 6 + 1 + 0) / 3)  # official: mean of sum(corrects) / 6
    assert scores["hallu_rate"] == pytest.approx((2 / 6) / 3)  # picks of the commonsense option
    assert scores["not_listed_rate"] == pytest.approx((1 / 6 + 1) / 3) and scores["unparsed"] == 6
    assert (scores["open_judged"], scores["open_unjudged"]) == (2, 1)
    assert scores["open_accuracy"] == 0.5 and scores["open_hallu_rate"] == 0.5
    # official totals: (MCQ shares + free-form right) over MCQ questions and judged free-form ones
    assert scores["total_accuracy"] == pytest.approx((3 / 6 + 1 + 1) / 5)
    assert scores["total_hallu_rate"] == pytest.approx((2 / 6 + 1) / 5)
    assert "open_accuracy" in scores["judge_dependent"]


def test_empty() -> None:
    scores = freak.score([], {})
    assert scores["accuracy"] is None and scores["hallu_rate"] is None and scores["questions"] == 0


async def test_free_form_through_the_judge(release_dir: Path) -> None:
    items = freak.load(release_dir, mode="open")
    predictions = {i.id: {"text": "It is a plain circle."} for i in items}
    judge = CannedJudge({
        "kick drum": "<judge>typical</judge><explanation>It says a perfect circle.</explanation>",
        "banana": "<judge>correct</judge>",
        "minute hand": DetectorError("judge canned failed (timeout): x", code="timeout"),
    })  # fmt: skip
    labels = await freak.judge(items, predictions, judge)
    assert labels["freak-2-open"]["judgement"] == "commonsense_error"
    assert labels["freak-4-open"]["judgement"] == "correct"
    assert labels["freak-6-open"]["judgement"] is None and "timeout" in labels["freak-6-open"]["judge_error"]
    prompt = judge.prompts[0]
    assert "Right answer: A circle, but the bottom is #straight#" in prompt
    assert "Commonsense (wrong) answer: A #perfect circle#" in prompt and "It is a plain circle." in prompt
    merged = {k: {**predictions[k], **v} for k, v in labels.items()}
    scores = freak.score(items, merged)
    assert (scores["open_judged"], scores["open_unjudged"]) == (2, 1)
    assert scores["open_accuracy"] == 0.5 and scores["open_hallu_rate"] == 0.5
    assert scores["open_other_error_rate"] == 0.0 and scores["accuracy"] is None
    assert [freak.correct(i, merged[i.id]) for i in items] == [False, True, None]  # 6 was never judged


@pytest.mark.parametrize(
    ("reply", "label"),
    [
        ("<judge>typical</judge>", "commonsense_error"),
        ("<judge>Wrong</judge><explanation>..</explanation>", "other_error"),
        ("<judge>correct</judge> then <judge>wrong</judge>", "correct"),  # the first tag, as the official
        # the official llm_as_judge scores anything but correct / typical 0: neither right nor a hallucination
        ("<judge>unsure</judge>", "other_error"),
        ("commonsense error", "other_error"),  # no tag
        ("no idea", "other_error"),
    ],
)
def test_parse_judgement(reply: str, label: str) -> None:
    assert freak.parse_judgement(reply) == label


@given(st.lists(st.sampled_from(["A", "B", "C", "D", "?", None]), min_size=6, max_size=6))
def test_outcome_shares_add_up(picks: list[str | None]) -> None:
    """Right, commonsense, not listed and the generated distractor cover every pick of a question."""
    items = [
        Item(id=f"x-o{k}", question="q", prompt="q", answer="ABC"[order.index(0)], options=("r", "c", "g", "n"),
             extra={"question_id": "x", "format": "mcq", "commonsense_letter": "ABC"[order.index(1)],
                    "correct_text": "r", "commonsense_text": "c"})
        for k, order in enumerate(freak.ORDERS)
    ]  # fmt: skip
    predictions = {i.id: p for i, p in zip(items, picks, strict=True) if p is not None}
    scores = freak.score(items, predictions)
    generated = sum(p == "ABC"[order.index(2)] for p, order in zip(picks, freak.ORDERS, strict=True)) / 6
    assert scores["accuracy"] + scores["hallu_rate"] + scores["not_listed_rate"] + generated == pytest.approx(1.0)
    assert scores["unparsed"] == sum(p in ("?", None) for p in picks)


def test_records_file_is_the_release_schema() -> None:
    """build/upload.py's features: id, image, options, hallu_answer, question, item, category, ground_truth,
    type."""
    for record in read_jsonl(DATA / "freak" / "records.jsonl"):
        assert set(record) | {"image"} == {"id", "image", "options", "hallu_answer", "question", "item", "category",
                                           "ground_truth", "type"}  # fmt: skip
        assert json.dumps(record)  # plain JSON, written to Parquet at test time
