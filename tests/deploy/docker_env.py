"""Whether Docker can run here, and the images the container tests need, built by the repo's script.

The container tests are opt-in (FAITHPROXY_CONTAINER_TESTS=1). Opted in, a test that needs Docker is
skipped on a developer's machine without it, and FAILS when the CI variable is set (tests/components.py):
a CI run that opts in starts dockerd first (scripts/dockerd.sh), so it must not pass by skipping the proof.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.components import in_ci
from tests.deploy import assets


def require_docker() -> None:
    """Skips (fails under CI) unless a Docker daemon answers and a compose command exists. Opt-in with
    FAITHPROXY_CONTAINER_TESTS=1: the builds take minutes (deploy/README.md, "What has run"), so only a
    run that means to pay for them (scripts/stack_scale_out.sh, CI when .ci/run starts dockerd) sets it."""
    if os.environ.get("FAITHPROXY_CONTAINER_TESTS") != "1":
        pytest.skip("container tests are opt-in: FAITHPROXY_CONTAINER_TESTS=1 after scripts/dockerd.sh start")
    problem = None
    if shutil.which("docker") is None:
        problem = "docker is not installed"
    elif subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        problem = "no Docker daemon answers `docker info`"
    elif shutil.which("docker-compose") is None and (
        subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode != 0
    ):
        problem = "neither docker-compose nor `docker compose` is installed"
    if problem is None:
        return
    message = f"{problem} (run `scripts/dockerd.sh start`: Debian's docker.io and docker-compose, dockerd)"
    if in_ci():
        pytest.fail(f"{message}; CI must start Docker rather than skip the container tests")
    pytest.skip(message)


def build_images(*images: str) -> None:
    """scripts/build_images.sh for `images` (Docker's layer cache makes a rebuild of unchanged code quick)."""
    result = subprocess.run(
        ["bash", "scripts/build_images.sh", *images],
        cwd=assets.REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if result.returncode != 0:
        output = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        pytest.fail(f"scripts/build_images.sh {' '.join(images)} failed:\n{output}")
