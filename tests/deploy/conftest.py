"""Fixtures for the deploy checks: the Prometheus binaries, and the real vLLM of tests/integration.

promtool and prometheus come from Debian's `prometheus` package (scripts/install_prometheus.sh). A test
that needs one is skipped when it is missing on a developer's machine, and FAILS when the CI variable
is set: CI must not pass by skipping the proof.
"""

from __future__ import annotations

import os
import shutil

import pytest

# The session fixtures that build the fixture model and start real vLLM live in tests/conftest.py, so
# the live Prometheus test scrapes the same vLLM as tests/integration.


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed (run scripts/install_prometheus.sh: Debian's prometheus package)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must install it rather than skip this check")
    pytest.skip(message)


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_binary("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return require_binary("prometheus")
