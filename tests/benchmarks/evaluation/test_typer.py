"""The step typer's labelled chains, its benchmark and its trainer: the data is what the proxy would cut,
the shipped typer meets its goal on the held-out chains, and the shipped parameters are what the trainer
makes of the committed tune data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faithproxy.benchmarks.evaluation import typer_bench, typer_train
from faithproxy.benchmarks.evaluation.labelled import KINDS, PERCEPTION
from faithproxy.benchmarks.evaluation.typer_data import (
    SPLITS,
    TyperDataError,
    chain_text,
    load_fixture,
    load_hand,
    load_shapesworld,
)
from faithproxy.faithcore.kinds import classify_step, keyword_kind
from faithproxy.faithcore.segmenter import segment_text
from faithproxy.faithcore.step_typer import PARAMS_PATH


@pytest.mark.parametrize("split", SPLITS)
def test_hand_chains_are_what_the_segmenter_cuts_and_are_labelled(split: str) -> None:
    chains = load_hand(split)
    assert len(chains) >= 20 and len({c.id for c in chains}) == len(chains)
    for chain in chains:
        assert chain.question and chain.extra["style"] and chain.extra["domain"]
        assert {s.kind for s in chain.steps} <= set(KINDS)
        assert any(s.kind == PERCEPTION for s in chain.steps)


def test_tune_and_heldout_share_only_stock_phrases() -> None:
    tune = {s.text for c in load_hand("tune") for s in c.steps}
    heldout = {s.text for c in load_hand("heldout") for s in c.steps}
    assert all(len(text.split()) <= 4 for text in tune & heldout)  # "Okay, let's see.", "The answer is 4."


def test_a_chain_the_segmenter_would_cut_otherwise_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tune.txt").write_text(
        "=== x | style=s | domain=d\nQ: q?\nP: The bar reads 3. It is red.\nR: So 3.\n", encoding="utf-8"
    )
    with pytest.raises(TyperDataError, match="chain x"):
        load_hand("tune", tmp_path)


def test_chain_text_breaks_paragraphs_and_list_items() -> None:
    text = chain_text(["Options:", "- A red car.", "So A.", "**Answer: A**"], {3})
    assert text == "Options:\n- A red car. So A.\n\n**Answer: A**"
    assert [s.text for s in segment_text(text) if s.text] == ["Options:", "- A red car.", "So A.", "**Answer: A**"]


def test_the_typer_reaches_its_recall_goal_on_held_out_chains() -> None:
    """The figures of docs/step-typer.md: a regression guard, not a tuning signal."""
    hand = typer_bench.score(load_hand("heldout"), classify_step)
    assert hand.recall >= 0.97
    assert hand.sent < 0.7  # the gate keeps a good share of steps from the judge
    assert hand.recall > typer_bench.score(load_hand("heldout"), keyword_kind).recall
    assert typer_bench.score(load_shapesworld("heldout", count=60), classify_step).recall == 1.0
    assert typer_bench.score(load_fixture(), classify_step).recall == 1.0


def test_the_bench_prints_a_row_per_source_and_typer(capsys: pytest.CaptureFixture[str]) -> None:
    assert typer_bench.main(["--split", "tune", "--misses"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["hand"], ["shapesworld"])]
    assert [(r[0], r[1]) for r in rows] == [
        ("hand", "typer"),
        ("hand", "keyword"),
        ("shapesworld", "typer"),
        ("shapesworld", "keyword"),
    ]
    assert "perception steps typed REASONING:" in out


def test_the_shipped_parameters_are_what_the_trainer_makes_of_the_tune_chains() -> None:
    shipped = json.loads(PARAMS_PATH.read_text(encoding="utf-8"))
    examples, weights = typer_train._training_set(load_hand("tune"), load_shapesworld("tune"))
    bias, coef = typer_train.fit(examples, weights)
    assert round(bias, 6) == pytest.approx(shipped["bias"], abs=1e-5)
    assert set(coef) == set(shipped["weights"])
    assert all(round(coef[f], 6) == pytest.approx(w, abs=1e-5) for f, w in shipped["weights"].items())
