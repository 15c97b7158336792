"""The real components a test may need, and the script that installs each.

On a developer's machine a test whose component is missing skips, and its message names the script to
run. Under CI (`CI=true`) the same test fails instead: CI runs every install script, so a missing
component there is a broken install step, and a green run must not hide it as a skip. tests/conftest.py
applies the rule to every skip, however the test asked for it (a `skipif` mark, `pytest.skip`,
`importorskip`), by reading the skip's reason.
"""

from __future__ import annotations

import os
import re

# Most specific first: "vllm-router" must not read as "vllm".
INSTALL_SCRIPTS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("vllm-router", re.compile(r"vllm[-_]router", re.IGNORECASE), "scripts/install_router.sh"),
    ("vLLM", re.compile(r"\bvllm\b", re.IGNORECASE), "scripts/install_vllm.sh"),
    ("redis-server", re.compile(r"\bredis", re.IGNORECASE), "scripts/install_redis.sh"),
    ("Prometheus", re.compile(r"prometheus|promtool", re.IGNORECASE), "scripts/install_prometheus.sh"),
    ("Chromium", re.compile(r"chrom(ium|edriver)", re.IGNORECASE), "scripts/install_chromium.sh"),
    ("Phoenix", re.compile(r"phoenix", re.IGNORECASE), "scripts/install_phoenix.sh"),
    ("LiteLLM", re.compile(r"litellm", re.IGNORECASE), "scripts/install_litellm.sh"),
)


def in_ci(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """`CI` set to anything but empty, 0, false or no (GitHub, GitLab and most runners set `true`)."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def install_script(reason: str) -> tuple[str, str] | None:
    """(component, install script) a skip's reason is about, or None for a skip of another kind."""
    for component, pattern, script in INSTALL_SCRIPTS:
        if pattern.search(reason):
            return component, script
    return None


def missing_component(reason: str, ci: bool) -> tuple[str, str] | None:
    """What becomes of a skip with this reason: None (an ordinary skip, left alone), ("skipped", message)
    with the install script named, or ("failed", message) under CI."""
    found = install_script(reason)
    if found is None:
        return None
    component, script = found
    if ci:
        return "failed", f"{reason} — CI must provide {component} (bash {script}) rather than skip this test"
    return "skipped", reason if script in reason else f"{reason} (install: bash {script})"
