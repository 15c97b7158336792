"""The under-load latency benchmark end to end, tiny: direct, 1 and 2 workers answer every request of
both loops correctly, and the figures are well-formed and consistent. Never how fast anything was."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from faithproxy.benchmarks.performance.latency_under_load import first_rate_over, schedule

ROOT = Path(__file__).resolve().parents[3]
TARGETS = {"direct", "1 worker", "2 workers"}


def test_first_rate_over_the_goal() -> None:
    def step(added: float | None, errors: int = 0) -> dict:
        return {
            "direct": {"errors": 0},
            "p": {"errors": errors, "added": {} if added is None else {"total_p99_ms": added}},
        }

    assert first_rate_over({"50": step(1.0), "100": step(6.0), "200": step(1.0)}, "p", 5.0)["value"] == 100.0
    within = first_rate_over({"50": step(1.0), "100": step(4.9)}, "p", 5.0)
    assert within == {"value": None, "goal": 5.0, "highest_rate_tried": 100.0, "met": True}
    assert first_rate_over({"50": step(1.0, errors=1)}, "p", 5.0)["value"] == 50.0  # failing counts as passing it
    assert first_rate_over({"50": step(None)}, "p", 5.0)["met"] is None


def test_schedule() -> None:
    assert schedule(4, 1.0, "even", random.Random(0)) == [0.25, 0.5, 0.75]
    times = schedule(1000, 1.0, "poisson", random.Random(0))
    assert times == sorted(times) and 0 < times[0] and times[-1] < 1.0 and 800 < len(times) < 1200


@pytest.mark.integration
def test_latency_under_load_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "under-load.json"
    argv = [sys.executable, "-m", "faithproxy.benchmarks.performance.latency_under_load", "--concurrency", "1,2"]
    argv += ["--requests", "8", "--windows", "2", "--rates", "10,20", "--step-s", "1", "--chunks", "4"]
    argv += ["--workdir", str(tmp_path / "work"), "--json", str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("command", "date", "machine", "config", "anchors"):
        assert result[key], key
    assert result["commit"] or not (ROOT / ".git").exists()  # a tree without git history names none
    assert {"uname", "cpus", "loadavg_start", "loadavg_end"} <= set(result["machine"])
    assert "--rates 10,20" in result["command"]

    for phase, keys in (("closed_loop", ["1", "2"]), ("open_loop", ["10", "20"])):
        assert list(result[phase]) == keys
        for by_target in result[phase].values():
            assert set(by_target) == TARGETS
            for name, f in by_target.items():
                assert f["requests"] > 0 and f["errors"] == 0, f
                for key in ("ttft", "total"):
                    assert 0 < f[f"{key}_p50_ms"] <= f[f"{key}_p99_ms"]
                if name != "direct":
                    for key, added in f["added"].items():
                        assert added == pytest.approx(f[key] - by_target["direct"][key], abs=0.002)
                    assert len(f["added"]) == 4
    for f in result["closed_loop"]["2"].values():
        assert f["requests"] == 8
    for f in result["open_loop"]["20"].values():
        assert f["sent"] == f["requests"] <= f["scheduled"] and f["asked_per_s"] == 20

    goals = result["goals"]["added_p99_under_5ms_at_rate"]
    assert set(goals) == {"1 worker", "2 workers"}
    for goal in goals.values():
        assert goal["goal"] == 5.0 and goal["highest_rate_tried"] == 20.0
        assert goal["value"] in (None, 10.0, 20.0) and goal["met"] == (goal["value"] is None)
