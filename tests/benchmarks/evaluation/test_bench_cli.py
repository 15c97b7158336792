"""Every `faithproxy bench` subcommand through the real entry point, `--json` output parsed and checked."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from faithproxy.benchmarks.evaluation.labelled import LabelledChain, LabelledStep, read_chains, write_chains
from faithproxy.benchmarks.standins.judge_server import create_app as judge_app
from faithproxy.cli import main
from faithproxy.testing import threaded_app
from tests.benchmarks.evaluation.test_judge_upr import evaluation_judge_app
from tests.benchmarks.evaluation.test_option_curve import CHAIN, fake_vllm_app


def trace_step(index: int, text: str, kind: str, verdict: str | None, **extra: Any) -> dict[str, Any]:
    """A step as server/observe/summary.py trace_steps writes it."""
    step = {"index": index, "channel": "content", "kind": kind, "text": text, "original_text": None,
            "verdict": verdict, "detected": verdict, "score": None, "attempts": 0, "rejected": [],
            "residual": False, "residual_reason": None, "unchecked_reason": None,
            "detector_latency_s": 0.01}  # fmt: skip
    step.update(extra)
    return step


def trace(request_id: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"version": 1, "id": request_id, "time": 1.0, "model": "m", "mode": "correct", "detector": "judge",
            "judge": None, "stream": True, "prompt": "What colour is the car?", "images": ["ab" * 32],
            "steps": steps, "answer": "B", "reasoning": None, "summary": {}, "usage": {}, "timings": {},
            "disconnected": False, "error": None}  # fmt: skip


TRACES = [
    trace("r1", [
        trace_step(0, "The image shows a car.", "perception", "faithful"),
        trace_step(1, "The car is red.", "perception", "faithful", original_text="The car is blue.",
                   detected="unfaithful", attempts=2, rejected=["The car is green."]),
        trace_step(2, "So the answer is A.", "reasoning", "faithful"),
    ]),
    trace("r2", [
        trace_step(0, "There are three dogs.", "perception", "unfaithful", attempts=3, residual=True,
                   residual_reason="regeneration_failed"),
        trace_step(1, "So the answer is C.", "reasoning", "faithful"),
    ]),
]  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any] | None, str]:
    code = main(["bench", *argv])
    captured = capsys.readouterr()
    data = json.loads(captured.out) if "--json" in argv and code == 0 else None
    return code, data, captured.out + captured.err


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TRACES))
    return path


def test_from_traces_and_upr(capsys: pytest.CaptureFixture[str], traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "chains.jsonl"
    code, data, _ = run(capsys, "from-traces", str(traces), "--out", str(out), "--json")
    assert code == 0 and data == {"chains": 2, "steps": 5, "out": str(out), "view": "delivered"}
    assert [s.text for s in read_chains(out)[0].steps] == ["The image shows a car.", "The car is red.",
                                                            "So the answer is A."]  # fmt: skip
    # delivered: residual UPR 1/3; original: detected UPR 2/3 (read straight from the trace file)
    code, data, _ = run(capsys, "upr", str(out), "--json")
    assert code == 0 and data["upr"] == pytest.approx(1 / 3)
    assert (data["perception_steps"], data["unfaithful_steps"], data["chains"]) == (3, 1, 2)
    code, data, _ = run(capsys, "upr", str(traces), "--view", "original", "--json")
    assert data["upr"] == pytest.approx(2 / 3) and data["unfaithful_steps"] == 2
    code, _, text = run(capsys, "upr", str(out))
    assert code == 0 and "UPR 33.33% = 1 unfaithful / 3 perception steps" in text


def _write(path: Path, chains: list[LabelledChain]) -> str:
    write_chains(path, chains)
    return str(path)


def _chain(chain_id: str, labels: list[bool | None], scores: list[float | None] | None = None) -> LabelledChain:
    scores = scores or [None] * len(labels)
    steps = [
        LabelledStep(f"{chain_id} step {i}", "perception", f, s)
        for i, (f, s) in enumerate(zip(labels, scores, strict=True))
    ]
    return LabelledChain(chain_id, "q", steps)


def test_f1_and_icc(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    gold = _write(tmp_path / "gold.jsonl", [_chain("a", [False, True, True]), _chain("b", [True, False])])
    pred = _write(tmp_path / "pred.jsonl", [_chain("a", [False, False, True], [0.9, 0.6, 0.1]),
                                            _chain("b", [True, True], [0.2, 0.4])])  # fmt: skip
    code, data, _ = run(capsys, "f1", "--gold", gold, "--pred", pred, "--json")
    # TP a0, FP a1, FN b1; TN a2, b0. AUROC: positives .9, .4 vs negatives .6, .1, .2 -> 5 of 6 pairs
    assert code == 0
    assert (data["precision"], data["recall"], data["f1"]) == (0.5, 0.5, 0.5)
    assert data["faithful"]["precision"] == pytest.approx(2 / 3) and data["faithful"]["f1"] == pytest.approx(2 / 3)
    assert data["auroc"] == pytest.approx(5 / 6) and data["steps"] == 5
    # steps 1-2: a0 TP, a1 FP, b0 TN, b1 FN; step 3: a2 TN only
    assert data["by_position"]["i<=2"]["f1"] == 0.5 and data["by_position"]["i<=2"]["steps"] == 4
    assert data["by_position"]["i>2"]["f1"] is None and data["by_position"]["i>2"]["steps"] == 1
    code, data, _ = run(capsys, "icc", "--a", gold, "--b", pred, "--json")
    # perception counts agree exactly (3, 2); unfaithful counts a: 1 vs 2, b: 1 vs 0 ->
    # MS_rows = 1 (row means 1.5, 0.5), MS_error = 1 -> (1 - 1) / (1 + 1) = 0
    assert code == 0 and data["icc_perception"] == pytest.approx(1.0) and data["chains"] == 2
    assert data["icc_unfaithful"] == pytest.approx(0.0)
    assert (data["unfaithful_steps_a"], data["unfaithful_steps_b"]) == (2, 2)
    code, data, _ = run(capsys, "icc", "--a", gold, "--b", pred, "--rater", gold, "--json")
    assert code == 0 and data["raters"] == 3 and data["unfaithful_steps_by_rater"] == [2, 2, 2]
    assert data["icc_perception"] == pytest.approx(1.0)
    code, _, text = run(capsys, "icc", "--a", gold, "--b", pred)
    assert code == 0 and "(A/B: 2/2 steps)" in text and "raters 2" in text
    fewer = _write(tmp_path / "fewer.jsonl", [_chain("a", [True, True, True])])
    code, _, text = run(capsys, "f1", "--gold", gold, "--pred", fewer, "--json")
    assert code == 2 and "bench f1: error: chain ids do not match: 1 gold chain(s) have no prediction" in text
    code, _, text = run(capsys, "upr", str(tmp_path / "absent.jsonl"))
    assert code == 2 and "no such file" in text


def test_replay_against_the_local_judge(capsys: pytest.CaptureFixture[str], traces: Path, tmp_path: Path) -> None:
    # The oracle agrees with the trace's original labels except on r2's step 0, which it calls faithful.
    app = judge_app({"unfaithful": ["The car is blue."]})
    with threaded_app(app, on_exit=app.state.judge.release.set) as url:
        judges = json.dumps([{"name": "local", "backend": "openai", "model": "j", "base_url": f"{url}/v1",
                              "api_key": "k", "max_retries": 0}])  # fmt: skip
        out = tmp_path / "pred.jsonl"
        code, data, text = run(capsys, "replay", "--traces", str(traces), "--detector", "judge", "--judges", judges,
                               "--out", str(out), "--no-progress", "--json")  # fmt: skip
        assert code == 0, text
        assert data["detector"] == "judge" and data["judge"] == "local" and data["chains"] == 2
        # r1: flagged at step 1, then one more call for step 2; r2: one call
        assert data["detector_calls"] == 3 and data["judge_calls"] == 3 and data["errors"] == 0
        assert (data["f1"]["precision"], data["f1"]["recall"], data["f1"]["f1"]) == (1.0, 0.5, pytest.approx(2 / 3))
        assert data["upr_gold"] == pytest.approx(2 / 3) and data["upr_predicted"] == pytest.approx(1 / 3)
        predictions = read_chains(out)
        assert predictions[0].steps[1].text == "The car is blue." and predictions[0].steps[1].faithful is False
        saved = tmp_path / "replay.json"
        saved.write_text(json.dumps(data))
        code, report, _ = run(capsys, "report", "--out", str(tmp_path / "r"), "--replay", str(saved), "--json")
        assert code == 0 and report["table_3"][0]["detector_calls"] == 3
        assert "| judge (local) | 66.7 | 100.0 | 50.0 |" in (tmp_path / "r" / "report.md").read_text()
        code, data, _ = run(capsys, "replay", "--traces", str(traces), "--detector", "judge", "--judges", judges,
                            "--limit", "1", "--batch", "1", "--no-progress", "--json")  # fmt: skip
        assert code == 0 and data["chains"] == 1 and data["steps"] == 3 and data["detector_calls"] == 3
        code, _, text = run(capsys, "replay", "--traces", str(traces), "--detector", "jduge", "--judges", judges)
        assert code == 2 and "did you mean 'judge'" in text
        code, _, text = run(capsys, "replay", "--traces", str(traces), "--detector", "judge", "--judges", "[{}]")
        assert code == 2 and "--judges: not a valid judge list" in text


def test_judge_upr(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    gold = [LabelledChain("a", "What colour?", [LabelledStep("The car is blue.", "perception", False),
                                                LabelledStep("So the answer is B.", "reasoning", None)]),
            LabelledChain("b", "How many?", [LabelledStep("There are two dogs.", "perception", False)])]  # fmt: skip
    path = _write(tmp_path / "in.jsonl", gold)
    with threaded_app(evaluation_judge_app()) as url:
        judges = json.dumps({"name": "eval", "backend": "anthropic", "model": "j", "base_url": url, "api_key": "k",
                             "max_retries": 0})  # fmt: skip
        out = tmp_path / "judged.jsonl"
        code, data, text = run(capsys, "judge-upr", path, "--judges", judges, "--out", str(out), "--no-progress",
                               "--json")  # fmt: skip
    assert code == 0, text
    # the evaluation judge finds 1 of the 2 perception steps unfaithful ("two dogs" is not in its list)
    assert (data["upr"], data["perception_steps"], data["unfaithful_steps"], data["chains"]) == (0.5, 2, 1, 2)
    assert data["judge"]["judge_calls"] == 2 and data["judge"]["errors"] == 0
    assert data["agreement"]["f1"]["recall"] == 0.5 and data["agreement"]["icc_perception"] is None
    assert [s.faithful for s in read_chains(out)[1].steps] == [True]
    code, _, text = run(capsys, "judge-upr", path, "--judges", "[]")
    assert code == 2 and "no judge configured" in text


def test_report(capsys: pytest.CaptureFixture[str], traces: Path, tmp_path: Path) -> None:
    vanilla = [LabelledChain("a", "q", [LabelledStep("s", "perception", False)], answer="(B)", gold_answer="A")]
    corrected = [LabelledChain("a", "q", [LabelledStep("s", "perception", True)], answer="A", gold_answer="A")]
    v, c = _write(tmp_path / "v.jsonl", vanilla), _write(tmp_path / "c.jsonl", corrected)
    logprobs = tmp_path / "lp.jsonl"
    logprobs.write_text(json.dumps({"id": "a", "gold_answer": "A", "option_logprobs": [
        {"A": math.log(0.25), "B": math.log(0.75)}, {"A": math.log(0.75), "B": math.log(0.25)}]}) + "\n")  # fmt: skip
    out = tmp_path / "report"
    code, data, text = run(capsys, "report", "--out", str(out), "--pair", "MMVP", v, c, "--swap", f"judge={c}",
                           "--regeneration", str(traces), "--logprobs", str(logprobs), "--json")  # fmt: skip
    assert code == 0, text
    assert data["table_11"][0]["vanilla"]["upr"] == 1.0 and data["table_11"][0]["corrected"]["accuracy"] == 1.0
    assert data["table_12"] == {"invoked": 2, "fixed_by_attempt": {"2": 1}, "fixed": 1, "failed": 1,
                                "failed_by_attempt": {"3": 1}}  # fmt: skip
    assert [p for _, p, _, _ in data["curve"]["by_step"]] == pytest.approx([0.25, 0.75])
    assert sorted(p.name for p in out.glob("*.png")) == [
        "detector_swap.png",
        "option_probability.png",
        "regeneration_outcomes.png",
        "upr_vanilla_vs_corrected.png",
    ]
    assert "| MMVP | 100.0 (1/1) | 0.0 (0/1) | 0.0 | 100.0 |" in (out / "report.md").read_text()
    code, _, text = run(capsys, "report", "--out", str(out), "--swap", "nofile")
    assert code == 2 and "--swap wants NAME=FILE" in text


def test_option_curve_feeds_the_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    chains = _write(tmp_path / "mcq.jsonl", [CHAIN])
    out = tmp_path / "lp.jsonl"
    with threaded_app(fake_vllm_app()) as url:
        code, data, text = run(capsys, "option-curve", chains, "--target", f"{url}/v1", "--model", "m", "--out",
                               str(out), "--no-progress", "--json")  # fmt: skip
    assert code == 0, text
    assert data["chains"] == 1 and data["failed_requests"] == 0
    assert [p for _, p, _, _ in data["by_step"]] == pytest.approx([2 / 3, 2 / 3, 0.2])
    code, data, text = run(capsys, "report", "--out", str(tmp_path / "r"), "--logprobs", str(out), "--json")
    assert code == 0 and data["curve"]["chains"] == 1 and (tmp_path / "r" / "option_probability.png").exists()


def test_run_is_handed_to_benchmarks_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "run", "-h"])
    assert info.value.code == 0
    assert "--dataset" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["bench", "nonsense"])
    assert info.value.code == 2


@pytest.mark.parametrize("seed", ["1000", "-1"])
def test_shapesworld_bench_refuses_a_training_or_negative_scene_seed(seed: str) -> None:
    with pytest.raises(SystemExit, match="--seed must be in 0..999"):
        main(["bench", "shapesworld", "--n", "5", "--seed", seed])
