"""The held-out protocol's refusals (benchmarks/evaluation/heldout.py): development seeds, uncommitted or
changed options, a dirty tree, and a second run on an evaluated seed unless it is labelled a rerun."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from faithproxy.benchmarks.evaluation import heldout
from faithproxy.benchmarks.evaluation.heldout import ProtocolError, check_seed, preflight, result_path

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "benchmarks" / "results" / "heldout" / "shapesworld-27191.options.json"


@pytest.mark.parametrize("seed", [997, 999, 0, 9_999, 300_000])
def test_development_and_training_seeds_are_refused(seed: int) -> None:
    with pytest.raises(ProtocolError):
        check_seed(seed)


def test_a_new_seed_is_accepted() -> None:
    check_seed(27191)


def test_results_go_beside_the_options_and_reruns_are_labelled() -> None:
    options = Path("benchmarks/results/heldout/shapesworld-5.options.json")
    assert result_path(options) == options.with_name("shapesworld-5.json")
    assert result_path(options, 2) == options.with_name("shapesworld-5.rerun-2.json")


def _git(tracked: bool, dirty: bool) -> Any:
    def git(*args: str) -> str:
        if args[0] == "ls-files":
            return "x\n" if tracked else ""
        return " M server/app.py\n" if dirty else ""

    return git


@pytest.fixture
def frozen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any]]:
    """The committed frozen file, copied; today's settings and files as frozen."""
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    monkeypatch.setattr(heldout, "proxy_settings", lambda: dict(data["settings"]))
    monkeypatch.setattr(heldout, "files_digest", lambda options: dict(data["files_sha256"]))
    path = tmp_path / "shapesworld-27191.options.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path, data


def test_a_committed_frozen_file_on_a_clean_tree_runs_once(
    frozen: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = frozen
    monkeypatch.setattr(heldout, "_git", _git(tracked=True, dirty=False))
    assert preflight(path, data, rerun=False) == 0
    result_path(path).write_text("{}", encoding="utf-8")  # evaluated
    with pytest.raises(ProtocolError, match="evaluated"):
        preflight(path, data, rerun=False)
    assert preflight(path, data, rerun=True) == 1


@pytest.mark.parametrize(("tracked", "dirty", "why"), [(False, False, "not committed"), (True, True, "clean tree")])
def test_an_uncommitted_file_or_a_dirty_tree_is_refused(
    frozen: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tracked: bool, dirty: bool, why: str
) -> None:
    path, data = frozen
    monkeypatch.setattr(heldout, "_git", _git(tracked, dirty))
    with pytest.raises(ProtocolError, match=why):
        preflight(path, data, rerun=False)


def test_a_setting_changed_since_the_freeze_is_refused(
    frozen: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = frozen
    monkeypatch.setattr(heldout, "_git", _git(tracked=True, dirty=False))
    monkeypatch.setattr(heldout, "proxy_settings", lambda: data["settings"] | {"regeneration_samples": 4})
    with pytest.raises(ProtocolError, match="regeneration_samples"):
        preflight(path, data, rerun=False)


def test_a_stopped_run_resumes_from_its_finished_parts_and_says_so(
    frozen: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Started again with the same frozen file, the run reads back its parts (resume=True into the
    run's own workdir) and the record names the parts it found."""
    from faithproxy.benchmarks.evaluation import shapesworld_bench

    path, data = frozen
    monkeypatch.setattr(heldout, "_git", _git(tracked=True, dirty=False))
    calls: list[dict[str, Any]] = []

    def benchmark(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append({"workdir": args[4], **kwargs})
        return {"labelled": {}, "detectors": {}}

    monkeypatch.setattr(shapesworld_bench, "benchmark", benchmark)
    monkeypatch.setattr(shapesworld_bench, "write_result", lambda result, out: out.write_text(json.dumps(result)))
    monkeypatch.setattr(shapesworld_bench, "markdown", lambda result: "")
    workdir = tmp_path / "work"
    (workdir / "shapesworld-27191").mkdir(parents=True)
    (workdir / "shapesworld-27191" / "raw-vanilla.json").write_text("{}")
    out = heldout.run(path, rerun=False, workdir=workdir)
    record = json.loads(out.read_text())
    assert calls[0]["resume"] is True and calls[0]["workdir"] == workdir / "shapesworld-27191"
    assert record["protocol"]["resumed_parts"] == ["raw-vanilla.json"]
    assert len(record["machine"]["loadavg_at_start"]) == len(record["machine"]["loadavg_at_end"]) == 3
