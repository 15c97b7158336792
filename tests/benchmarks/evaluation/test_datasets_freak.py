"""FREAK: the 6 option orders, Acc and HalluRate (unparseable counts as D), and the free-form judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from faithproxy.benchmarks.evaluation.datasets import Item, freak
from faithproxy.faithcore.errors import DetectorError
from tests.benchmarks.canned_judge import CannedJudge

RECORDS = [
    {"id": "q1", "image": "images/q1.jpg", "question": "How many legs does the chicken have?", "answer": "three",
     "commonsense_distractor": "two", "generated_distractor": "four", "category": "counting"},
    {"id": "q2", "image": "images/q2.jpg", "question": "What colour is the banana?", "answer": "blue",
     "commonsense_distractor": "yellow", "generated_distractor": "green", "category": "attribute"},
]  # fmt: skip


def write_freak(root: Path, name: str = "freak.json") -> Path:
    (root / "images").mkdir(parents=True)
    for r in RECORDS:
        Image.new("RGB", (8, 8)).save(root / r["image"])
    text = json.dumps(RECORDS) if name.endswith(".json") else "\n".join(json.dumps(r) for r in RECORDS)
    (root / name).write_text(text)
    return root


def test_six_orders_with_d_fixed(tmp_path: Path) -> None:
    items = freak.load(write_freak(tmp_path))
    assert len(items) == 12 and len({i.id for i in items}) == 12
    q1 = items[:6]
    assert {i.options for i in q1} == {
        (*order, freak.NOT_LISTED)
        for order in [("three", "two", "four"), ("three", "four", "two"), ("two", "three", "four"),
                      ("two", "four", "three"), ("four", "three", "two"), ("four", "two", "three")]
    }  # fmt: skip
    for item in q1:  # the gold and commonsense letters point at their texts in every order
        assert item.options["ABCD".index(item.answer)] == "three"
        assert item.options["ABCD".index(item.extra["commonsense_letter"])] == "two"
    assert q1[0].prompt == (
        "How many legs does the chicken have? Options: A. three B. two C. four D. The correct answer is not listed."
    )
    assert q1[0].image == tmp_path / "images/q1.jpg"


def test_acc_and_hallu_rate_over_the_orders(tmp_path: Path) -> None:
    items = freak.load(write_freak(tmp_path, "freak.jsonl"))
    q1, q2 = items[:6], items[6:]

    def pick(item, text):  # the letter an option text has in this item's order
        return "ABCD"[item.options.index(text)]

    # q1: right twice, commonsense twice, D once, unparseable once (counts as D)
    replies = [
        pick(q1[0], "three"),
        f"The answer is {pick(q1[1], 'two')}.",
        f"<think>Chickens have two legs, but this one...</think>({pick(q1[2], 'three').lower()})",
        f"The answer is {pick(q1[3], 'two')}.",
        r"\boxed{D}",
        "I am not sure.",
    ]
    predictions = {item.id: {"text": text} for item, text in zip(q1, replies, strict=True)}
    # q2: right four times, the generated distractor once, one reply missing (D)
    for item in q2[:4]:
        predictions[item.id] = {"text": item.extra["correct_text"]}  # the option text instead of a letter
    predictions[q2[4].id] = {"text": "green"}
    scores = freak.score(items, predictions)
    assert scores["questions"] == 2 and scores["mcq_items"] == 12
    assert scores["accuracy"] == pytest.approx((2 / 6 + 4 / 6) / 2)
    assert scores["hallu_rate"] == pytest.approx((2 / 6 + 0) / 2)
    assert scores["not_listed_rate"] == pytest.approx((2 / 6 + 1 / 6) / 2)
    assert scores["unparsed"] == 2
    assert scores["open_judged"] == 0 and scores["open_accuracy"] is None


def test_empty() -> None:
    scores = freak.score([], {})
    assert scores["accuracy"] is None and scores["hallu_rate"] is None and scores["questions"] == 0


async def test_free_form_through_the_judge(tmp_path: Path) -> None:
    write_freak(tmp_path)
    records = json.loads((tmp_path / "freak.json").read_text())
    records.append({**records[0], "id": "q3", "question": "How many wheels does the car have?"})
    (tmp_path / "freak.json").write_text(json.dumps(records))
    items = freak.load(tmp_path, mode="open")
    assert [i.id for i in items] == ["freak-q1-open", "freak-q2-open", "freak-q3-open"]
    assert items[0].prompt == "How many legs does the chicken have?" and items[0].options == ()
    predictions = {i.id: {"text": "It has two legs."} for i in items}
    judge = CannedJudge({
        "chicken": "The model says two.\nLabel: COMMONSENSE_ERROR",
        "banana": "Label: correct",
        "wheels": DetectorError("judge canned failed (timeout): x", code="timeout"),
    })  # fmt: skip
    labels = await freak.judge(items, predictions, judge)
    assert labels["freak-q1-open"]["judgement"] == "commonsense_error"
    assert labels["freak-q2-open"]["judgement"] == "correct"
    assert labels["freak-q3-open"]["judgement"] is None and "timeout" in labels["freak-q3-open"]["judge_error"]
    assert "Right answer: three" in judge.prompts[0] and "Commonsense (wrong) answer: two" in judge.prompts[0]
    merged = {k: {**predictions[k], **v} for k, v in labels.items()}
    scores = freak.score(items, merged)
    assert (scores["open_judged"], scores["open_unjudged"]) == (2, 1)
    assert scores["open_accuracy"] == 0.5 and scores["open_hallu_rate"] == 0.5
    assert scores["open_other_error_rate"] == 0.0 and scores["accuracy"] is None
    assert [freak.correct(i, merged[i.id]) for i in items] == [False, True, None]  # q3 was never judged


def test_both_modes_and_bad_mode(tmp_path: Path) -> None:
    assert len(freak.load(write_freak(tmp_path), mode="both")) == 14
    with pytest.raises(ValueError, match="mode"):
        freak.load(tmp_path, mode="free")


@pytest.mark.parametrize(
    ("reply", "label"),
    [("Label: OTHER_ERROR", "other_error"), ("commonsense error", "commonsense_error"), ("no idea", None)],
)
def test_parse_judgement(reply: str, label: str | None) -> None:
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
