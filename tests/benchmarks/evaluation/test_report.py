"""The report: its tables carry the right numbers, and every plot is a real PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from faithproxy.benchmarks.evaluation.labelled import LabelledChain, LabelledStep
from faithproxy.benchmarks.evaluation.report import (
    accuracy,
    answers_match,
    build_report,
    freak_curve,
    option_probabilities,
    paper_figure,
    regeneration_outcomes,
    scores_beside,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def chain(chain_id: str, labels: list[bool | None], answer: str | None, gold: str | None) -> LabelledChain:
    steps = [LabelledStep(f"s{i}", "perception", f) for i, f in enumerate(labels)]
    steps.append(LabelledStep("So the answer is it.", "reasoning", None))
    return LabelledChain(chain_id, "q", steps, answer=answer, gold_answer=gold)


# MMVP vanilla: 2 unfaithful of 5 perception steps, 1 of 2 answers right; corrected: 0 of 5, 2 of 2.
VANILLA = [chain("a", [True, False, True], "The answer is (B).", "B"), chain("b", [False, True], "\\boxed{C}", "A")]
CORRECTED = [chain("a", [True, True, True], "<answer>B</answer>", "B"), chain("b", [True, True], "A", "A")]


def test_answer_matching() -> None:
    assert answers_match("The answer is (b), because...", "B")
    assert answers_match("\\boxed{ D }", "D") and answers_match("<answer>c</answer>", "(C)")
    assert answers_match("A. a red car", "A") and not answers_match("A red car", "A")
    assert not answers_match(None, "A") and not answers_match("no idea", "A")
    assert not answers_match("To answer a question, look.", "A") and answers_match("Answer: a", "A")
    assert answers_match("Two apples.", "two apples") and not answers_match("three apples", "two apples")
    graded = [LabelledChain("x", "q", answer="wrong", gold_answer="A", extra={"correct": True}),
              LabelledChain("y", "q", answer="A", gold_answer=None)]  # fmt: skip
    assert accuracy(graded) == (1.0, 1)  # the record's own grade wins; no gold, no score


def test_regeneration_outcomes_from_trace_steps() -> None:
    records = [
        {"steps": [{"attempts": 1, "original_text": "x"}, {"attempts": 0}, {"attempts": 3, "original_text": None}]},
        {"steps": [{"attempts": 2, "original_text": "y"}, {"attempts": 1, "original_text": "z"}]},
        {"steps": []},
    ]
    outcomes = regeneration_outcomes(records)
    assert outcomes.invoked == 4 and outcomes.fixed_by_attempt == {1: 2, 2: 1} and outcomes.failed == 1
    assert outcomes.failed_by_attempt == {3: 1} and outcomes.fixed == 3


LOGPROBS = [
    {"id": "r1", "gold_answer": "B", "option_logprobs": [{"A": math.log(0.5), "B": math.log(0.5)},
                                                         {"A": math.log(0.2), "B": math.log(0.8)}]},
    {"id": "r2", "gold_answer": "A", "distractor": "B",
     "option_logprobs": [{"A": math.log(0.9), "B": math.log(0.1)},
                         {"A": math.log(0.3), "B": math.log(0.6), "C": math.log(0.1)},
                         {"A": math.log(1.2), "B": math.log(0.8)}]},  # unnormalised: 0.6 / 0.4
    {"id": "r3", "gold_answer": "A", "option_logprobs": []},  # nothing to plot
]  # fmt: skip


def test_option_probabilities_and_curve() -> None:
    probs = option_probabilities({"a": -1.0, "B": -1.0, "C": -math.inf})
    assert probs == {"A": 0.5, "B": 0.5, "C": 0.0}
    curve = freak_curve(LOGPROBS)
    assert curve.chains == 2
    assert [(k, n) for k, _, _, n in curve.by_step] == [(0, 2), (1, 2), (2, 1)]
    assert [p for _, p, _, _ in curve.by_step] == pytest.approx([0.7, 0.55, 0.6])
    assert [d for _, _, d, _ in curve.by_step] == pytest.approx([0.1, 0.6, 0.4])
    # relative positions: r1 at 0 and 1, r2 at 0, 0.5 and 1 (ten bins)
    assert [(round(c, 2), n) for c, _, n in curve.by_position] == [(0.05, 2), (0.55, 1), (0.95, 2)]
    assert [p for _, p, _ in curve.by_position] == pytest.approx([0.7, 0.3, 0.7])


def test_report_files_and_numbers(tmp_path: Path) -> None:
    regen = [{"steps": [{"attempts": 1, "original_text": "x"}, {"attempts": 3, "original_text": None}]}]
    data = build_report(
        tmp_path / "out",
        pairs=[("MMVP", VANILLA, CORRECTED)],
        swap=[("judge", CORRECTED), ("prompt", VANILLA)],
        regeneration=regen,
        logprobs=LOGPROBS,
        title="toy",
    )
    out = tmp_path / "out"
    for name in ("upr_vanilla_vs_corrected.png", "detector_swap.png", "regeneration_outcomes.png",
                 "option_probability.png"):  # fmt: skip
        assert (out / name).read_bytes().startswith(PNG_MAGIC) and (out / name).stat().st_size > 2000
    md = (out / "report.md").read_text()
    assert md.startswith("# toy\n")
    # the paper's MMVP accuracy is pair accuracy: without the runs' scores it is not set beside per-chain accuracy
    assert "| MMVP | 40.0 (2/5) | 0.0 (0/5) | 50.0 | 100.0 | 2 / 2 | 8.4 → 1.7 | pair accuracy | – | – |" in md
    assert "| judge | 0.0 | 0 / 5 | 100.0 | 2 |" in md and "| prompt | 40.0 | 2 / 5 | 50.0 | 2 |" in md
    assert "| fixed in 1 try | 1 | 50.0 |" in md and "| failed after all tries | 1 | 50.0 |" in md
    assert "| 1 | 0.550 | 0.600 | 2 |" in md
    assert "![UPR vanilla vs corrected](upr_vanilla_vs_corrected.png)" in md
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(data))
    assert data["table_11"][0]["vanilla"]["upr"] == pytest.approx(0.4)
    assert data["table_12"]["fixed_by_attempt"] == {1: 1} and data["table_12"]["failed"] == 1


def test_detector_table_from_replay_reports(tmp_path: Path) -> None:
    judge = {"detector": "judge", "judge": "claude", "detector_calls": 12, "judge_calls": 13, "latency_p50_s": 0.25,
             "f1": {"f1": 0.9, "precision": 1.0, "recall": 0.818, "auroc": None, "steps": 40},
             "f1_by_position": {"i<=2": {"f1": 1.0}, "i>2": {"f1": 0.8}}}  # fmt: skip
    prompt = {"detector": "prompt", "judge": None, "detector_calls": 20, "judge_calls": None, "latency_p50_s": None,
              "f1": {"f1": 0.3, "precision": 0.25, "recall": 0.375, "auroc": 0.6, "steps": 40}}  # fmt: skip
    data = build_report(tmp_path, detectors=[judge, prompt])
    md = (tmp_path / "report.md").read_text()
    assert "| judge (claude) | 90.0 | 100.0 | 81.8 | – | 100.0 | 80.0 | 12 | 13 | 250 | 40 |" in md
    assert "| prompt | 30.0 | 25.0 | 37.5 | 60.0 | – | – | 20 | – | – | 40 |" in md
    assert "prompting 30.8" in md and (tmp_path / "detector_f1.png").read_bytes().startswith(PNG_MAGIC)
    assert data["table_3"][1]["detector"] == "prompt"


def test_sections_are_optional(tmp_path: Path) -> None:
    data = build_report(tmp_path, swap=[("none", [chain("a", [], None, None)])])
    md = (tmp_path / "report.md").read_text()
    assert "Table 11" not in md and "| none | – | 0 / 0 | – | 1 |" in md
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["detector_swap.png"]
    assert data["files"] == {"table_4": "detector_swap.png"}


def test_paper_accuracy_only_beside_a_figure_of_its_definition(tmp_path: Path) -> None:
    """issue 19: the paper's MMVP 35.0 → 39.7 is pair accuracy (the official grader's only figure), so it
    goes beside the runs' pair accuracy from scores.json, never beside accuracy per chain."""
    scores = ({"metrics": {"accuracy": 0.5, "pair_accuracy": 0.25}},
              {"metrics": {"accuracy": 1.0, "pair_accuracy": 0.5}})  # fmt: skip
    hb = ({"metrics": {"aAcc": 0.6}}, None)  # the corrected run has no scores: no comparison at all
    data = build_report(tmp_path, pairs=[("MMVP", VANILLA, CORRECTED), ("HallusionBench", VANILLA, CORRECTED)],
                        pair_scores=[scores, hb])  # fmt: skip
    md = (tmp_path / "report.md").read_text()
    same = "| 40.0 (2/5) | 0.0 (0/5) | 50.0 | 100.0 | 2 / 2 |"  # UPR and per-chain accuracy, as before
    mmvp = f"| MMVP {same} 8.4 → 1.7 | pair accuracy | 25.0 → 50.0 | 35.0 → 39.7 |"
    hallusion = f"| HallusionBench {same} 22.0 → 7.9 | aAcc (per question) | – | – |"
    assert mmvp in md and hallusion in md
    assert data["table_11"][0]["paper_figure"] == {"definition": "pair accuracy", "vanilla": 0.25, "corrected": 0.5}


def test_scores_beside_reads_the_run_folder(tmp_path: Path) -> None:
    (tmp_path / "scores.json").write_text(json.dumps({"metrics": {"Micro_Average": {"perception_score": 78.5}}}))
    scores = scores_beside(tmp_path / "chains.jsonl")
    assert paper_figure("MMEvalPro", scores) == pytest.approx(0.785)  # auto_score.py reports percentages
    assert scores_beside(tmp_path / "elsewhere" / "chains.jsonl") is None
    assert paper_figure("unknown-bench", scores) is None
