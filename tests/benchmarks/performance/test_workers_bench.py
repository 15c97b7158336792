"""The workers benchmark end to end, small: 1 and 2 workers answer every request correctly, in both
modes, and the figures are there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_workers_script_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "workers.json"
    argv = [sys.executable, "-m", "faithproxy.benchmarks.performance.workers", "--windows", "1", "--requests", "24"]
    argv += ["--concurrency", "4", "--chunks", "4", "--idle-s", "1", "--workdir", str(tmp_path / "work")]
    argv += ["--json", str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    figures = result["throughput"]
    assert set(figures) == {"off", "correct/none"}
    for by_proxy in figures.values():
        assert set(by_proxy) == {"1 worker", "2 workers"}
        for f in by_proxy.values():
            assert f["errors"] == 0 and f["rps_median"] > 0 and f["proxy_cpu_ms_per_request"] > 0
    idle = result["idle_cpu_ms_per_s"]
    assert set(idle) == {"1 worker", "2 workers"} and all(ms >= 0 for ms in idle.values())
