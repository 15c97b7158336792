"""The CI rule for real components (tests/components.py): skip with the install script named outside
CI, fail under `CI=true`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.components import in_ci, missing_component

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("reason", "script"),
    [
        ("vllm is not installed", "scripts/install_vllm.sh"),
        ("vllm-router is not installed at .venv-router/bin/vllm-router", "scripts/install_router.sh"),
        ("redis-server is not on PATH", "scripts/install_redis.sh"),
        ("promtool is not installed", "scripts/install_prometheus.sh"),
        ("chromium and chromedriver are needed", "scripts/install_chromium.sh"),
        ("Arize Phoenix is not installed at .venv-phoenix/bin/phoenix", "scripts/install_phoenix.sh"),
        ("LiteLLM is not installed at .venv-litellm/bin/litellm", "scripts/install_litellm.sh"),
    ],
)
def test_a_missing_component_skips_naming_its_script_and_fails_under_ci(reason: str, script: str) -> None:
    assert missing_component(reason, ci=False) == ("skipped", f"{reason} (install: bash {script})")
    outcome, message = missing_component(reason, ci=True)  # type: ignore[misc]
    assert outcome == "failed"
    assert reason in message and f"bash {script}" in message


def test_other_skips_are_left_alone() -> None:
    assert missing_component("this C library has no malloc_trim", ci=True) is None
    assert missing_component("window of one sentence", ci=False) is None


def test_ci_is_any_value_but_empty_or_false() -> None:
    assert [in_ci({"CI": v}) for v in ("true", "1", "yes", "TRUE")] == [True] * 4
    assert [in_ci({"CI": v}) for v in ("", "0", "false", "no")] == [False] * 4
    assert not in_ci({})


def test_a_run_with_a_missing_component_fails_under_ci_and_skips_outside(tmp_path: Path) -> None:
    """The hook in tests/conftest.py, loaded as a plugin into a pytest run of one test that finds no
    redis-server: the same test skips (naming the script) without CI and fails with CI=true."""
    (tmp_path / "test_needs_redis.py").write_text(
        "import pytest\n\ndef test_it():\n    pytest.skip('redis-server is not installed')\n", encoding="utf-8"
    )
    outcomes = {}
    for ci in ("", "true"):
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-rsf", "-q",
             str(tmp_path / "test_needs_redis.py")],
            cwd=REPO, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "CI": ci},
        )  # fmt: skip
        outcomes[ci] = (run.returncode, run.stdout)
    code, out = outcomes[""]
    assert code == 0 and "1 skipped" in out and "bash scripts/install_redis.sh" in out, out
    code, out = outcomes["true"]
    assert code == 1 and "1 failed" in out and "bash scripts/install_redis.sh" in out, out
