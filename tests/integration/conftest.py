"""Session fixtures of the integration tests beyond tests/conftest.py: the tiny reasoning-format models
(benchmarks/tinyvlm/train_formats.py), built once into var/models/formats (or $FAITHPROXY_FORMATS_MODEL_DIR) and
reused while their digest matches."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path

import pytest

from tests.conftest import REPO, _require

DEFAULT_FORMATS_DIR = REPO / "var" / "models" / "formats"


@pytest.fixture(scope="session")
def formats_model_dir() -> Path:
    """The format models' parent directory: one model directory per family (formats_spec.FAMILIES)."""
    _require("torch")
    _require("transformers")
    out = Path(os.environ.get("FAITHPROXY_FORMATS_MODEL_DIR", DEFAULT_FORMATS_DIR))
    out.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "faithproxy.benchmarks.tinyvlm.train_formats", "--out", str(out), "--if-stale"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        pytest.fail(f"building the format models failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return out


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and "format_servers" in getattr(item, "fixturenames", ()):
        servers = getattr(item, "funcargs", {}).get("format_servers")
        if servers is not None and servers.current is not None:
            report.sections.append(("vLLM log (tail)", servers.current.log_tail()))
    return report
