"""The labelled-chain format: round trips, unknown fields kept, validation errors that say where."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from faithproxy.benchmarks.evaluation.labelled import (
    LabelledChain,
    LabelledFormatError,
    LabelledStep,
    iter_chains,
    read_chains,
    write_chains,
)
from faithproxy.benchmarks.shapesworld.dataset import generate_items
from faithproxy.benchmarks.shapesworld.export import write_chains_jsonl

RECORD = {
    "id": "c1",
    "question": "What colour is the car?",
    "image": "img/c1.png",
    "steps": [
        {"text": "The car is red.", "kind": "perception", "faithful": False, "score": 0.9, "channel": "content"},
        {"text": "So the answer is B.", "kind": "reasoning", "faithful": None},
    ],
    "answer": "B",
    "gold_answer": "A",
    "source": {"dataset": "toy"},
}


def _lines(*records: object) -> list[str]:
    return [json.dumps(r) for r in records]


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    (chain,) = list(iter_chains(_lines(RECORD)))
    assert chain.steps[0].score == 0.9 and chain.steps[0].extra == {"channel": "content"}
    assert chain.extra == {"source": {"dataset": "toy"}}
    assert (chain.perception_steps, chain.unfaithful_steps) == (1, 1)
    assert write_chains(path, [chain]) == 1
    assert json.loads(path.read_text()) == RECORD
    assert read_chains(path)[0] == chain


def test_score_is_written_only_when_present() -> None:
    out = io.StringIO()
    write_chains(out, [LabelledChain("x", "q", [LabelledStep("The dot is blue.", "perception", True)])])
    step = json.loads(out.getvalue())["steps"][0]
    assert step == {"text": "The dot is blue.", "kind": "perception", "faithful": True}


def test_blank_lines_are_skipped_and_missing_optionals_are_null() -> None:
    chains = list(iter_chains(["", json.dumps({"id": "a", "steps": []}), "  \n"]))
    assert len(chains) == 1
    assert (chains[0].question, chains[0].image, chains[0].answer, chains[0].gold_answer) == ("", None, None, None)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"question": "q", "steps": []}, "'id' is required"),
        ({"id": "a", "question": "q"}, "'steps' is required"),
        ({"id": "a", "steps": [{"kind": "perception"}]}, "step 0: 'text' is required"),
        ({"id": "a", "steps": [{"text": "t", "kind": "visual"}]}, "'kind' must be"),
        ({"id": "a", "steps": [{"text": "t", "faithful": "yes"}]}, "'faithful' must be true, false or null"),
        ({"id": "a", "steps": [{"text": "t", "score": "high"}]}, "'score' must be a finite number"),
        ({"id": "a", "steps": [{"text": "t", "score": float("nan")}]}, "'score' must be a finite number"),
        ({"id": "a", "steps": [], "image": 3}, "'image' must be a string or null"),
        ([1, 2], "a record must be a JSON object"),
    ],
)
def test_invalid_records_name_the_line_and_field(record: object, message: str) -> None:
    with pytest.raises(LabelledFormatError) as info:
        list(iter_chains(["", json.dumps(record)], "f.jsonl"))
    assert message in str(info.value)
    assert str(info.value).startswith("f.jsonl:2")


def test_bad_json_and_duplicate_ids_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LabelledFormatError, match=r"f:1: not valid JSON"):
        list(iter_chains(["{nope"], "f"))
    with pytest.raises(LabelledFormatError, match=r"f:2: id 'a' appears twice"):
        list(iter_chains(_lines({"id": "a", "steps": []}, {"id": "a", "steps": []}), "f"))
    with pytest.raises(LabelledFormatError, match="no such file"):
        read_chains(tmp_path / "absent.jsonl")


def test_reads_shapesworld_export(tmp_path: Path) -> None:
    items = list(generate_items(3, 8, hallucination_rate=0.5))
    path = tmp_path / "sw.jsonl"
    write_chains_jsonl(path, ((i.id, i.scene, i.question, i.chain) for i in items))
    chains = read_chains(path)
    assert [c.id for c in chains] == [i.id for i in items]
    for chain, item in zip(chains, items, strict=True):
        assert [s.text for s in chain.steps] == [s.text for s in item.chain.steps]
        assert chain.gold_answer == item.question.gold_letter and chain.answer == item.chain.answer
        unfaithful = sum(1 for s in item.chain.steps if s.kind == "perception" and s.faithful is False)
        assert chain.unfaithful_steps == unfaithful
        assert chain.extra == {} and all(s.extra == {} and s.score is None for s in chain.steps)
    assert sum(c.unfaithful_steps for c in chains) > 0
    # and it writes them back byte for byte (same key order, same values)
    out = tmp_path / "again.jsonl"
    write_chains(out, chains)
    assert out.read_text(encoding="utf-8") == path.read_text(encoding="utf-8")
