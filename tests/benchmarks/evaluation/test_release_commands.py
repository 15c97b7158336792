"""`bench validate`, `bench score`, and `bench run`'s check of the release before its first request."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from faithproxy.benchmarks.evaluation import run as bench_run
from faithproxy.benchmarks.evaluation.cli import main as bench_main
from tests.benchmarks.evaluation.releases import RELEASES, unpack


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = bench_main(list(argv))
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else None, captured.err


RECORDS = {
    "mmvp": {"test": 4},
    "hallusionbench": {"VS": 20, "VD": 16},
    "mmevalpro": {"MMMU": 6, "MathVista": 3, "ScienceQA": 6},
    "freak": {"mcq": 3, "fib": 3},
    "mmgcot": {"attributes": 7, "judge": 6, "objects": 5},
    "mirage": {"multi_choice": 2, "approx": 2, "free_form": 3},
}


@pytest.mark.parametrize("name", sorted(RELEASES))
def test_validate_every_excerpt(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = bench(capsys, "validate", "--dataset", name, "--data-dir", str(unpack(name, tmp_path / name)))
    assert code == 0 and report["records"] == RECORDS[name] and report["problems"] == []
    assert report["dataset"] == name and report["records_total"] == sum(RECORDS[name].values())


def test_validate_lists_every_problem_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = unpack("hallusionbench", tmp_path / "hb")
    (root / "hallusion_bench" / "VD" / "video" / "19_1.png").unlink()
    (root / "hallusion_bench" / "VD" / "video" / "19_2.png").write_bytes(b"")
    code, report, _ = bench(capsys, "validate", "--dataset", "hallusionbench", "--data-dir", str(root))
    assert code == 1
    assert report["problem_counts"] == {"missing_image": 4, "unreadable_image": 4}
    assert {p["record"].split(" ")[-1] for p in report["problems"]} == {f"(VD/video/19/{f}/{q})" for f in (1, 2)
                                                                         for q in range(4)}  # fmt: skip
    assert report["items"] == 28 and report["records_total"] == 36


def test_validate_an_empty_folder_and_an_unknown_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = bench(capsys, "validate", "--dataset", "mirage", "--data-dir", str(tmp_path))
    assert code == 1 and report["problem_counts"] == {"missing_file": 1}
    assert report["problems"][0]["path"] == str(tmp_path / "mirage.tsv")
    code, _, err = bench(capsys, "validate", "--dataset", "hallusion", "--data-dir", str(tmp_path))
    assert code == 2 and "Did you mean 'hallusionbench'" in err


def test_score_our_predictions_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What `bench run` writes (predictions.jsonl, last record of an id wins); only answered items count."""
    root = unpack("hallusionbench", tmp_path / "hb")
    lines = [
        {"id": "hb-VS-chart-3-1-0", "text": "No.", "reasoning": "The chart says India."},
        {"id": "hb-VS-chart-3-1-1", "text": "Yes."},  # wrong (gold no) ...
        {"id": "hb-VS-chart-3-1-1", "text": "No."},  # ... then asked again and right
        {"id": "hb-nothing", "text": "Yes."},
    ]
    preds = tmp_path / "predictions.jsonl"
    preds.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, out, _ = bench(capsys, "score", "--dataset", "hallusionbench", "--data-dir", str(root), "--predictions",
                         str(preds))  # fmt: skip
    assert code == 0 and out["format"] == "ours"
    assert (out["items_scored"], out["items_without_prediction"], out["predictions_unmatched"]) == (2, 34, 1)
    assert out["metrics"]["aAcc"] == 1.0 and out["metrics"]["fAcc"] == 1.0


def test_score_refuses_a_file_that_answers_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = unpack("mmvp", tmp_path / "mmvp")
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "other-1", "text": "A"}) + "\n")
    code, _, err = bench(capsys, "score", "--dataset", "mmvp", "--data-dir", str(root), "--predictions",
                         str(tmp_path / "p.jsonl"))  # fmt: skip
    assert code == 2 and "answers none of the 4 items" in err
    code, _, err = bench(capsys, "score", "--dataset", "mmvp", "--data-dir", str(root), "--predictions",
                         str(tmp_path / "absent.jsonl"))  # fmt: skip
    assert code == 2 and "no predictions file" in err


def test_score_needs_no_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = unpack("mmvp", tmp_path / "mmvp")
    for image in (root / "MMVP Images").iterdir():
        image.unlink()
    (tmp_path / "answer.jsonl").write_text("".join(
        json.dumps({"question_id": n, "prompt": "q", "answer": "(a)", "response": r}) + "\n"
        for n, r in ((1, "(a)"), (2, "(b)"), (5, "(b)"), (6, "(b)"))
    ))  # fmt: skip
    code, out, _ = bench(capsys, "score", "--dataset", "mmvp", "--data-dir", str(root), "--predictions",
                         str(tmp_path / "answer.jsonl"))  # fmt: skip
    assert code == 0 and out["format"] == "official"
    assert (out["metrics"]["pairs"], out["metrics"]["pair_accuracy"]) == (2, 0.5)  # (1, 2) right, (5, 6) not


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_run.add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_run_stops_before_asking_when_images_are_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = unpack("mmgcot", tmp_path / "gcot")
    (root / "vg" / "VG_100K" / "2361224.jpg").unlink()
    out = tmp_path / "out"
    # the target is not even reachable: the run must stop before it would find out
    args = parse("--dataset", "mmgcot", "--data-dir", str(root), "--target", "http://127.0.0.1:9", "--out", str(out))
    assert await bench_run.run(args) == 2
    err = capsys.readouterr().err
    assert "mmgcot: 1 record(s) cannot be used (missing_image 1)" in err
    assert "GCoT_dataset_attributes_test.json #0 (id 1)" in err and "2361224.jpg" in err and "--skip-missing" in err
    assert not out.exists()


async def test_skip_missing_leaves_them_out_and_says_how_many(tmp_path: Path) -> None:
    root = unpack("mmgcot", tmp_path / "gcot")
    (root / "vg" / "VG_100K" / "2361224.jpg").unlink()
    out = tmp_path / "out"
    args = parse("--dataset", "mmgcot", "--data-dir", str(root), "--target", "http://127.0.0.1:9", "--model", "m",
                 "--out", str(out), "--skip-missing", "--max-retries", "0", "--limit", "2")  # fmt: skip
    assert await bench_run.run(args) == 1  # nothing answered: the target is down
    scores = json.loads((out / "scores.json").read_text())
    assert scores["skipped"] == {"records": 1, "by_kind": {"missing_image": 1}}
    asked = bench_run.read_jsonl(out / "predictions.jsonl")
    assert sorted(asked) == ["mmgcot-attributes-3", "mmgcot-attributes-4"]  # the first usable items


def test_score_a_judged_run_with_its_judgements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """FREAK free form: the judge's labels live in judgements.jsonl; `--judgements` merges them."""
    root = unpack("freak", tmp_path / "freak")
    (tmp_path / "predictions.jsonl").write_text("".join(
        json.dumps({"id": f"freak-{n}-open", "text": "An answer."}) + "\n" for n in (2, 4, 6)
    ))  # fmt: skip
    (tmp_path / "judgements.jsonl").write_text(
        json.dumps({"id": "freak-2-open", "judgement": "correct"})
        + "\n"
        + json.dumps({"id": "freak-4-open", "judgement": "commonsense_error"})
        + "\n"
    )
    argv = ["score", "--dataset", "freak", "--data-dir", str(root), "--loader-arg", "mode=open",
            "--predictions", str(tmp_path / "predictions.jsonl")]  # fmt: skip
    code, out, _ = bench(capsys, *argv, "--judgements", str(tmp_path / "judgements.jsonl"))
    assert code == 0 and out["items_scored"] == 3
    metrics = out["metrics"]
    assert (metrics["open_judged"], metrics["open_unjudged"], metrics["open_accuracy"]) == (2, 1, 0.5)
    code, out, _ = bench(capsys, *argv)  # without them nothing is judged, and it says so
    assert out["metrics"]["open_judged"] == 0 and out["metrics"]["open_accuracy"] is None
