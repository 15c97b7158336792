"""`faithproxy bench shapesworld`'s rows and scoring on hand-made traces, its README table, and the
README's copy of it (the end-to-end run through real vLLM is in tests/benchmarks/shapesworld/test_sw_model_vllm.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from faithproxy.benchmarks.evaluation import shapesworld_bench as bench
from faithproxy.benchmarks.evaluation.shapesworld_report import goals, readme_block, readme_section, readme_table
from faithproxy.benchmarks.evaluation.shapesworld_rows import (
    answer_changes,
    cascade_decisions,
    draft_scores,
    error_kind,
    errors_by_kind,
    judge_bill,
    parse_row,
    step_type,
    unchecked_steps,
)
from faithproxy.benchmarks.shapesworld.language import CountClaim, ObjectClaim, RelationClaim, render_claim
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items
from faithproxy.benchmarks.shapesworld.world import Ref, WorldObject
from faithproxy.cli import main

REPO = Path(__file__).resolve().parents[3]
RESULT = REPO / "benchmarks" / "results" / "shapesworld-all.json"  # the README's table: every row


# ----------------------------------------------------------------------------------------- rows


def test_rows_name_a_detector_and_the_judge_it_asks() -> None:
    assert parse_row("judge:learned").headers() == {
        "x-faithproxy-mode": "correct",
        "x-faithproxy-detector": "judge",
        "x-faithproxy-judge": "learned",
    }
    assert (parse_row("judge").judge, parse_row("cascade").judge) == ("pixels", "learned")
    assert parse_row("cascade:pixels").judge == "pixels" and parse_row("cascade").reads_hidden_states
    assert "x-faithproxy-judge" not in parse_row("prompt").headers()
    row = parse_row("cascade@0.3+rewrites=judge")
    assert (row.flag_threshold, row.rewrites, row.headers()["x-faithproxy-cascade-rewrites"]) == (0.3, "judge", "judge")
    assert (
        parse_row("cascade").rewrites is None and "x-faithproxy-cascade-rewrites" not in parse_row("cascade").headers()
    )
    for bad in ("judge+rewrites=judge", "cascade+rewrites=probe"):
        with pytest.raises(ValueError, match="rewrites="):
            parse_row(bad)
    assert parse_row("probe").reads_hidden_states and parse_row("probe").judge is None
    for bad, message in (("prompt:learned", "calls no judge"), ("judge:gpt", "unknown judge"), ("jugde", "judge")):
        with pytest.raises(ValueError, match=message):
            parse_row(bad)


def test_rows_without_their_model_or_probe_are_left_out_by_default_and_refused_by_name(tmp_path: Path) -> None:
    judge = tmp_path / "judge"
    rows, left_out = bench.choose_rows(None, judge, None)
    assert rows == ["judge:pixels", "prompt"]
    assert set(left_out) == {"judge:learned", "probe", "cascade"} and "--judge-model" in left_out["judge:learned"]
    judge.mkdir()
    (judge / "config.json").write_text("{}")
    rows, left_out = bench.choose_rows(None, judge, tmp_path / "probe.json")
    assert rows == ["judge:pixels", "judge:learned", "prompt", "probe", "cascade"] and left_out == {}
    with pytest.raises(SystemExit, match="row probe: no probe file"):
        bench.choose_rows("judge:pixels,probe", judge, None)
    with pytest.raises(SystemExit, match="twice"):
        bench.choose_rows("judge,judge", judge, None)


def test_the_bench_names_the_trainers_judge_folder() -> None:
    from faithproxy.benchmarks.shapesworld.model.train_judge import JUDGE_WEIGHTS_DIR

    assert bench.JUDGE_WEIGHTS_DIR == JUDGE_WEIGHTS_DIR


# ------------------------------------------------------------------------- hand-made chains


def step(index: int, text: str, detected: str | None = "faithful", **extra: Any) -> dict[str, Any]:
    """A step as server/observe/summary.py trace_steps writes it."""
    out = {"index": index, "kind": "perception", "text": text, "original_text": None, "detected": detected,
           "verdict": detected, "attempts": 0, "residual": False, "unchecked_reason": None}  # fmt: skip
    return out | extra


def reply(sentences: list[str], letter: str) -> str:
    chain = " ".join([*sentences, f"So the answer is {letter}."])
    return f"<think>\n{chain}\n</think>\n\nThe answer is {letter}."


def other_letter(letter: str) -> str:
    return "A" if letter != "A" else "B"


@pytest.fixture(scope="module")
def items() -> list[Any]:
    return heldout_items(3)


def true_and_false(item: Any) -> tuple[str, str]:
    """A true sentence about the item's first object, and the same with the wrong colour."""
    obj = item.scene.objects[0]
    wrong = "green" if obj.colour != "green" else "red"
    truth = render_claim(ObjectClaim(Ref.of(obj)))
    false = render_claim(ObjectClaim(Ref(obj.shape, wrong, obj.size, obj.row, obj.col)))
    return truth, false


def test_false_flags_their_tries_and_the_answers_they_changed(items: list[Any]) -> None:
    (t0, f0), (t1, f1), (t2, _) = (true_and_false(i) for i in items)
    gold = [i.question.gold_letter for i in items]
    traces = [
        # a true step flagged (a false flag) and rewritten after 2 tries: the chain diverges there
        {"steps": [step(0, "Rewritten.", "unfaithful", original_text=t0, attempts=2), step(1, f0, "faithful")]},
        # a false step caught and fixed first, then a false flag kept after 3 failed tries
        {
            "steps": [
                step(0, t1, "unfaithful", original_text=f1, attempts=1),
                step(1, t1, "unfaithful", attempts=3, residual=True),
            ]
        },  # fmt: skip
        # nothing rewritten: the chain must be vanilla's
        {"steps": [step(0, t2, "faithful")]},
    ]
    vanilla = [reply([t0, f0], gold[0]), reply([f1], other_letter(gold[1])), reply([t2], gold[2])]
    corrected = [reply(["Rewritten.", f0], other_letter(gold[0])), reply([t1, t1], gold[1]), vanilla[2]]
    out = answer_changes(items, traces, vanilla, corrected)
    assert out["false_flags"] == {
        "steps": 2,
        "regeneration_tries": 5,
        "steps_rewritten": 1,
        "chains_first_rewritten_at_a_false_flag": 1,
        "answers_changed": 1,
        "right_to_wrong": 1,
        "wrong_to_right": 0,
    }
    changed = out["answers_vs_vanilla"]
    assert (changed["answers_changed"], changed["right_to_wrong"], changed["wrong_to_right"]) == (2, 1, 1)
    assert changed["by_cause"]["true_flag"] == {"chains": 1, "answers_changed": 1, "right_to_wrong": 0,
                                                "wrong_to_right": 1}  # fmt: skip
    assert changed["by_cause"]["untouched"] == {"chains": 1, "answers_changed": 0, "right_to_wrong": 0,
                                                "wrong_to_right": 0}  # fmt: skip
    assert changed["by_cause"]["kept"]["chains"] == 0  # chain 1 kept a flag, but its first flag was rewritten
    assert (out["untouched_identical_to_vanilla"], out["kept_identical_to_vanilla"]) == (1.0, None)
    # The false step left unflagged in chain 0 is a miss; the caught one is a hit; P/R count perception only.
    g = draft_scores(items, traces)["detector_vs_ground_truth"]
    assert (g["tp"], g["fp"], g["fn"]) == (1, 2, 1)


def test_where_a_detector_errs_by_step_type_and_error_kind(items: list[Any]) -> None:
    item = items[0]
    truth, false = true_and_false(item)
    absent = render_claim(CountClaim(0, Ref(shape=item.scene.objects[0].shape)))  # there is one: false
    n = sum(o.shape == item.scene.objects[0].shape for o in item.scene.objects)
    count = render_claim(CountClaim(n + 1, Ref(shape=item.scene.objects[0].shape)))
    trace = {"steps": [step(0, truth, "unfaithful"), step(1, false, "faithful"), step(2, absent, "unfaithful"),
                       step(3, count, None, unchecked_reason="detector_error"),
                       step(4, "So the answer is B.", "unfaithful", kind="reasoning")]}  # fmt: skip
    out = errors_by_kind([item], [trace])
    assert out["by_step_type"]["object_in_cell"] == {"tp": 0, "fp": 1, "fn": 1, "tn": 0}
    assert out["by_step_type"]["absence"] == {"tp": 1, "fp": 0, "fn": 0, "tn": 0}
    assert out["by_step_type"]["count"] == {"tp": 0, "fp": 0, "fn": 1, "tn": 0}
    assert out["missed_by_error_kind"] == {"colour": 1, "count": 1}
    assert out["caught_by_error_kind"] == {"existence": 1}
    assert unchecked_steps([item], [trace]) == {"detector_error": 1}


def test_error_kinds_and_step_types_of_claims() -> None:
    objects = [WorldObject("circle", "red", "large", 0, 0), WorldObject("square", "blue", "small", 1, 1)]
    cases = {
        ObjectClaim(Ref("circle", "green", "large", 0, 0)): ("object_in_cell", "colour"),
        ObjectClaim(Ref("square", "green", "small", 0, 0)): ("object_in_cell", "shape+colour+size"),
        ObjectClaim(Ref("circle", None, None, 2, 2)): ("object_in_cell", "existence"),
        ObjectClaim(Ref("circle", "red", None, None, 2)): ("object", "position"),
        ObjectClaim(Ref("triangle", "red", "large")): ("object", "shape"),
        ObjectClaim(Ref("circle", "red", "small")): ("object", "size"),
        CountClaim(2, Ref(shape="circle")): ("count", "count"),
        CountClaim(0, Ref(colour="blue")): ("absence", "existence"),
        RelationClaim(Ref(shape="circle"), "below", Ref(shape="square")): ("relation", "position"),
        RelationClaim(Ref(shape="cross"), "above", Ref(shape="square")): ("relation", "existence"),
    }
    for claim, (form, kind) in cases.items():
        assert (step_type(claim), error_kind(claim, objects)) == (form, kind), claim


def test_the_judges_bill_and_the_cascades_decisions_add_up() -> None:
    summaries = [
        {"judge": {"calls": 2, "input_tokens": 300, "cached_input_tokens": 64, "output_tokens": 40, "descriptions": 1}},
        {"judge": {"calls": 1, "input_tokens": 50, "cached_input_tokens": 200, "output_tokens": 9}},
        {},  # a request whose detector called no judge
    ]
    assert judge_bill(summaries) == {"calls": 3, "input_tokens": 350, "cached_input_tokens": 264,
                                     "cache_creation_tokens": 0, "output_tokens": 49, "descriptions": 1}  # fmt: skip
    page = (
        "# TYPE faithproxy_cascade_decisions_total counter\n"
        'faithproxy_cascade_decisions_total{stage="probe"} 17.0\n'
        'faithproxy_cascade_decisions_total{stage="judge"} 5.0\n'
        'faithproxy_cascade_decisions_created{stage="probe"} 1.7e9\n'
    )
    assert cascade_decisions(page) == {"probe": 17, "judge": 5}


# ------------------------------------------------------------------------------- README table


def row_result(detector: str, judge: str | None, upr: float, f1: float, calls: int) -> dict[str, Any]:
    return {
        "detector": detector,
        "judge": judge,
        "corrected": {"upr": upr, "accuracy": 0.75},
        "upr_first_draft": 0.15,
        "upr_detected": 0.12,
        "detector_vs_ground_truth": {"precision": 0.9, "recall": f1, "f1": f1},
        "false_flags": {"regeneration_tries": 4, "answers_changed": 2, "right_to_wrong": 1, "wrong_to_right": 1},
        "judge_bill": {"calls": calls, "input_tokens": 1234, "cached_input_tokens": 5678, "output_tokens": 90},
        "wall_s": 60.0,
        "upr_reduction_vs_vanilla": round(1 - upr / 0.15, 4),
    }


RESULT_FIXTURE = {
    "n_chains": 300,
    "scenes_seed": 999,
    "vanilla": {"upr": 0.15, "accuracy": 0.7, "wall_s": 20.0},
    "detectors": {
        "judge:learned": row_result("judge", "learned", 0.05, 0.8, 400),
        "probe": row_result("probe", None, 0.1, 0.5, 0),
        "cascade": row_result("cascade", "learned", 0.06, 0.79, 150),
    },
}


def test_the_readme_table_has_a_line_per_configuration_and_the_goals_their_figures() -> None:
    table = readme_table(RESULT_FIXTURE).splitlines()
    assert len(table) == 2 + 1 + 3 and table[2].startswith("| vanilla | 0.150 |")
    assert table[3] == (
        "| judge:learned | 0.150 | 0.120 | 0.050 | 0.750 | 0.90 / 0.80 / 0.80 | 4, 2 (1 / 1) | 400 | "
        "1,234 / 5,678 / 90 | 3.0× |"
    )
    assert "| – | – | 3.0× |" in table[4]  # the probe calls no judge
    g = goals(RESULT_FIXTURE)
    assert g["learned_judge"]["upr_reduction"] == pytest.approx(0.6667, abs=1e-4) and g["learned_judge"]["met"]
    assert g["cascade"]["calls_saved"] == 0.625 and g["cascade"]["f1_points_lost"] == 1.0
    assert g["cascade"]["residual_upr_points_from_judge"] == 1.0 and g["cascade"]["met"]
    assert g["probe"] == {"f1": 0.5, "target_f1": 0.6, "met": False}
    block = readme_block(RESULT_FIXTURE)
    assert readme_section(f"intro\n\n{block}\n\nmore") == block and readme_section("no table here") is None


def test_readme_table_option_prints_the_table_of_a_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(RESULT_FIXTURE))
    assert main(["bench", "shapesworld", "--readme-table", str(path)]) == 0
    assert capsys.readouterr().out == readme_table(RESULT_FIXTURE)


def test_the_readmes_shapesworld_table_is_the_committed_results() -> None:
    result = json.loads(RESULT.read_text(encoding="utf-8"))
    section = readme_section((REPO / "README.md").read_text(encoding="utf-8"))
    assert section is not None, "README.md lacks the ShapesWorld detectors table (see shapesworld_report.py)"
    assert section == readme_block(result), (
        "README's ShapesWorld table differs from the committed result: paste the output of "
        "`faithproxy bench shapesworld --readme-table benchmarks/results/shapesworld-all.json`"
    )


# ------------------------------------------------------------------------------- merging runs


def split_fixture() -> tuple[dict[str, Any], dict[str, Any]]:
    """RESULT_FIXTURE as two runs: the judge alone, then probe and cascade (vanilla 10 s slower)."""
    rows = RESULT_FIXTURE["detectors"]
    judge = RESULT_FIXTURE | {"detectors": {"judge:learned": rows["judge:learned"]}, "command": "run one"}
    judge["models"] = {"generator": {"path": "g", "sha256": "aa"}, "judge": {"path": "j", "sha256": "bb"}}
    rest = RESULT_FIXTURE | {"detectors": {k: rows[k] for k in ("probe", "cascade")}, "command": "run two"}
    rest["vanilla"] = RESULT_FIXTURE["vanilla"] | {"wall_s": 30.0}
    rest["models"] = judge["models"] | {"probe": {"path": "p.json", "sha256": "cc"}}
    rest["left_out"] = {"judge:pixels": "not asked"}
    return judge, rest


def test_runs_over_the_same_scenes_merge_into_one_result_whose_goals_span_them() -> None:
    from faithproxy.benchmarks.evaluation.shapesworld_merge import merge

    judge, rest = split_fixture()
    assert "cascade" not in goals(rest)  # the cascade's goal needs the judge-alone row of the other run
    merged = merge([judge, rest], ["a.json", "b.json"])
    assert list(merged["detectors"]) == ["judge:learned", "probe", "cascade"]
    assert merged["goals"] == goals(RESULT_FIXTURE) and merged["goals"]["cascade"]["met"]
    assert set(merged["models"]) == {"generator", "judge", "probe"} and merged["upr_residual"] == 0.05
    assert [r["rows"] for r in merged["runs"]] == [["judge:learned"], ["probe", "cascade"]]
    assert [r["command"] for r in merged["runs"]] == ["run one", "run two"]
    assert merged["left_out"] == {"judge:pixels": "not asked"}
    table = readme_table(merged).splitlines()  # each row's wall against its own run's vanilla
    assert table[3].endswith("| 3.0× |") and table[4].endswith("| 2.0× |")


def test_runs_that_scored_different_things_are_refused_by_the_field_that_differs() -> None:
    from faithproxy.benchmarks.evaluation.shapesworld_merge import MergeError, merge

    judge, rest = split_fixture()
    for changed, message in (
        (rest | {"scenes_seed": 997}, "scenes_seed"),
        (rest | {"vanilla": rest["vanilla"] | {"upr": 0.2}}, "vanilla pass differs"),
        (rest | {"models": {"judge": {"path": "j", "sha256": "other"}}}, "judge is not the same weights"),
        (rest | {"detectors": {"judge:learned": RESULT_FIXTURE["detectors"]["judge:learned"]}}, "earlier run"),
    ):
        with pytest.raises(MergeError, match=message):
            merge([judge, changed], ["a.json", "b.json"])
    with pytest.raises(MergeError, match="at least two"):
        merge([judge], ["a.json"])


def test_merge_option_merges_committed_runs_and_refuses_without_out(tmp_path: Path) -> None:
    """The two committed runs of the first learned judge (judges and prompt; probe and cascade) over the
    same 300 held-out scenes, merged as they were for the README before one run held every row."""
    results = REPO / "benchmarks" / "results"
    sources = [results / "shapesworld-detectors.json", results / "shapesworld-probe-cascade.json"]
    runs = [json.loads(path.read_text(encoding="utf-8")) for path in sources]
    out = tmp_path / "all.json"
    args = ["bench", "shapesworld", "--merge", *map(str, sources)]
    with pytest.raises(SystemExit, match="needs --out"):
        main(args)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(runs[1] | {"n_chains": 100}))
    with pytest.raises(SystemExit, match="n_chains"):
        main(["bench", "shapesworld", "--merge", str(sources[0]), str(other), "--out", str(out)])
    assert not out.exists()  # a refused merge writes nothing
    assert main([*args, "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    rows = {name: (row, run["vanilla"]["wall_s"]) for run in runs for name, row in run["detectors"].items()}
    assert written["detectors"] == {name: row | {"vanilla_wall_s": wall} for name, (row, wall) in rows.items()}
    alone = runs[0]["detectors"]["judge:learned"]["judge_bill"]["calls"]
    assert written["goals"]["cascade"]["judge_calls_judge_alone"] == alone
    assert set(written["goals"]) == {"learned_judge", "cascade", "probe"} and "--merge" in written["command"]
    assert all(run["command"] in out.with_suffix(".md").read_text() for run in runs)
    assert out.with_suffix(".png").is_file()


# ------------------------------------------------------------------------- rows with a flag threshold


def test_a_row_may_name_a_flag_threshold_sent_as_the_header() -> None:
    row = parse_row("judge:learned@0.4")
    assert (row.detector, row.judge, row.flag_threshold) == ("judge", "learned", 0.4)
    assert row.headers()["x-faithproxy-flag-threshold"] == "0.4"
    assert parse_row("cascade@0.35").headers()["x-faithproxy-flag-threshold"] == "0.35"
    assert "x-faithproxy-flag-threshold" not in parse_row("judge:learned").headers()
    for bad, message in (("prompt@0.5", "calls no judge"), ("judge@high", "must be a number"), ("judge@1.5", "0 to 1")):
        with pytest.raises(ValueError, match=message):
            parse_row(bad)


def test_unsure_steps_are_not_flags_and_are_counted_with_their_truth(items: list[Any]) -> None:
    item = items[0]
    truth, false = true_and_false(item)
    trace = {"steps": [step(0, false, "unsure"), step(1, truth, "unsure"), step(2, false, "unfaithful", residual=True)]}
    scores = draft_scores([item], [trace])
    g = scores["detector_vs_ground_truth"]
    assert (g["tp"], g["fp"], g["fn"]) == (1, 0, 1)  # the unsure false step is a miss, not a catch
    assert scores["unsure_steps"] == {"steps": 2, "false_by_ground_truth": 1}


def test_threshold_rows_get_issue_32s_goals_against_the_same_detector_without_one() -> None:
    base = row_result("judge", "learned", 0.05, 0.8, 400) | {
        "false_flags": {"regeneration_tries": 30, "answers_changed": 0, "right_to_wrong": 0, "wrong_to_right": 0}
    }
    at = row_result("judge", "learned", 0.06, 0.62, 300) | {"flag_threshold": 0.4}
    at["detector_vs_ground_truth"] = {"precision": 0.5, "recall": 0.62, "f1": 0.55}
    result = RESULT_FIXTURE | {"detectors": {"judge:learned": base, "judge:learned@0.4": at}}
    g = goals(result)
    assert g["learned_judge"]["upr_residual"] == 0.05  # issue 21's goal reads the row without a threshold
    x = g["flag_thresholds"]["judge:learned@0.4"]
    assert (x["false_flag_tries"], x["false_flag_tries_without_threshold"], x["wall_vs_vanilla"]) == (4, 30, 3.0)
    assert x["met"] == {"precision_at_recall": True, "upr_reduction": True, "accuracy": True, "false_flag_tries": True}
    worse = at | {"detector_vs_ground_truth": {"precision": 0.5, "recall": 0.55, "f1": 0.52}}
    alone = goals(RESULT_FIXTURE | {"detectors": {"judge:learned@0.4": worse}})["flag_thresholds"]
    assert alone["judge:learned@0.4"]["met"]["precision_at_recall"] is False
    assert alone["judge:learned@0.4"]["met"]["false_flag_tries"] is None  # no row without a threshold to compare
    from faithproxy.benchmarks.evaluation.shapesworld_report import _goal_lines  # the report's goal lines

    line = next(x for x in _goal_lines(result) if x.startswith("- judge:learned@0.4"))
    assert "P 0.50 at R 0.62" in line and "false-flag tries 4 against 30" in line and "3.0× vanilla" in line


def test_items_can_start_past_the_chains_a_probe_was_trained_on() -> None:
    later = heldout_items(5, 997, start=1600)
    assert [i.id.split("-")[2] for i in later] == ["1600", "1601", "1602", "1603", "1604"]
    assert later[0].id == heldout_items(1601, 997)[1600].id


async def test_a_stopped_run_resumes_from_the_parts_it_saved(tmp_path: Path) -> None:
    """Every finished part (vanilla, each row) is saved in the workdir; with resume, parts saved for the
    same items are read back and nothing is asked of vLLM (here nothing listens at its URL)."""
    items = heldout_items(2)
    ids = [i.id for i in items]
    bench.save_part(tmp_path, "vanilla", ids, {"replies": ["a", "b"], "wall_s": 3.0})
    row = {"replies": [["x", "r1", {}], ["y", "r2", {}]], "wall_s": 9.0, "prefix_caches_reset": True}
    bench.save_part(tmp_path, "judge:pixels@0.5", ids, {"row": row, "traces": {"r1": {"id": "r1"}, "r2": {"id": "r2"}}})
    raw = await bench.run_all("http://127.0.0.1:9", items, ["judge:pixels@0.5"], 2, tmp_path, 3, resume=True)
    assert raw["vanilla_replies"] == ["a", "b"] and raw["vanilla_wall_s"] == 3.0
    assert raw["judge:pixels@0.5"] == row and set(raw["traces"]) == {"r1", "r2"}
    assert (tmp_path / "raw-judge-pixels@0.5.json").is_file()
    assert bench.load_part(tmp_path, "vanilla", ids[::-1]) is None  # saved for other items: not reused
    assert bench.load_part(tmp_path, "prompt", ids) is None
