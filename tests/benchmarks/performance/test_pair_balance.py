"""pair_balance: a slot's bias, the same factor in both orders of a pair, cancels out."""

from __future__ import annotations

import json
from pathlib import Path

from faithproxy.benchmarks.performance.pair_balance import balanced, main


def _pair(path: Path, ratios: dict[str, float], quiet: bool = True) -> str:
    path.write_text(json.dumps({"comparison": {"after_over_before": ratios, "quiet": quiet}}))
    return str(path)


def test_a_bias_of_the_measured_slot_cancels() -> None:
    bias, change = 1.05, 0.98  # the measured slot costs 5% more; the change saves 2%
    first = {"correct/none stream": change * bias}
    swapped = {"correct/none stream": (1 / change) * bias}
    assert balanced(first, swapped) == {"correct/none stream": change}


def test_the_goal_needs_both_runs_quiet_and_no_more_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    first = _pair(tmp_path / "a.json", {"off": 0.9, "correct": 1.06})
    swapped = _pair(tmp_path / "b.json", {"off": 1.0, "correct": 1.0, "detect": 1.2}, quiet=False)
    assert main([first, swapped, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["balanced"]) == {"off", "correct"}  # only what both measured
    assert result["goals"]["off"]["balanced"] == 0.949
    assert result["goals"]["off"]["met"] is False  # the swapped run was not quiet
    assert result["both_quiet"] is False
