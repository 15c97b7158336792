"""The processes the overhead benchmark races: the fast upstream, faithproxy in front of it, LiteLLM's
proxy in front of it. Each runs in its own process on 127.0.0.1, so none shares an event loop (or a
GIL) with the measuring client.

faithproxy is started the way an operator starts it (`faithproxy serve`), in off mode with no detector,
its concurrency limit raised for the 1,000-stream run (all through FAITHPROXY_* variables: no server
default changes). LiteLLM runs from its own venv (`.venv-litellm`; installing `litellm[proxy]` into the
project venv would upgrade huggingface_hub under vLLM) as a bare pass-through: one worker, no
database, no callbacks, spend and error logs off, ERROR logging, the bundled model cost map.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
LITELLM_BIN = ROOT / ".venv-litellm" / "bin" / "litellm"
MASTER_KEY = "sk-bench"  # LiteLLM refuses to start without one; every target gets the same header
MODEL = "fake"


@dataclass
class Target:
    """One thing the client sends requests to, and the process behind it (for `direct`, the upstream
    itself; for a proxy, the process whose memory and CPU are the proxy's own)."""

    name: str
    base_url: str
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        # A new session: stopping it later signals the whole group (LiteLLM may fork helpers).
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


def _base_env() -> dict[str, str]:
    """The caller's environment without settings that would change what is measured."""
    drop = ("FAITHPROXY_", "LITELLM_", "DATABASE_URL", "OPENAI_", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(drop)}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def start_upstream(workdir: Path, chunks: int) -> Target:
    port = free_port()
    log = workdir / "upstream.log"
    argv = [
        sys.executable,
        "-m",
        "faithproxy.benchmarks.standins.fast_upstream",
        "--port",
        str(port),
        "--chunks",
        str(chunks),
    ]
    return Target("direct", f"http://127.0.0.1:{port}", _spawn(argv, _base_env(), log), log)


def start_faithproxy(workdir: Path, upstream: str, max_concurrent: int) -> Target:
    port = free_port()
    log = workdir / "faithproxy.log"
    env = _base_env() | {
        "FAITHPROXY_DEFAULT_MODE": "off",
        "FAITHPROXY_DEFAULT_DETECTOR": "none",
        "FAITHPROXY_MAX_CONCURRENT_REQUESTS": str(max_concurrent),
    }
    exe = Path(sys.executable).with_name("faithproxy")
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "faithproxy.cli"]
    argv = head + ["serve", "--upstream", upstream, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--log-level", "warning"]
    return Target("faithproxy", f"http://127.0.0.1:{port}", _spawn(argv, env, log), log)


def litellm_available() -> bool:
    return LITELLM_BIN.exists()


def start_litellm(workdir: Path, upstream: str) -> Target:
    port = free_port()
    log = workdir / "litellm.log"
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: dummy\n"
        "litellm_settings:\n"
        "  callbacks: []\n"
        "  success_callback: []\n"
        "  failure_callback: []\n"
        "  telemetry: false\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n"
        "  disable_spend_logs: true\n"
        "  disable_error_logs: true\n"
    )
    env = _base_env() | {
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOG": "ERROR",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "DISABLE_ADMIN_UI": "True",
    }
    argv = [str(LITELLM_BIN), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--num_workers", "1"]
    return Target("litellm", f"http://127.0.0.1:{port}", _spawn(argv, env, log), log)


class TargetExited(RuntimeError):
    """The process ended before it answered (e.g. its port was taken between picking and binding)."""


def start_ready(start: Callable[[], Target], path: str, timeout_s: float, tries: int = 3) -> Target:
    """Starts a target and waits until `path` answers; one that exits at once is started again on
    another port (ports are picked free here and bound by the child, so another process can win)."""
    for attempt in range(tries):
        target = start()
        try:
            wait_ready(target, path, timeout_s)
            return target
        except BaseException as exc:
            stop(target)
            if not isinstance(exc, TargetExited) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def wait_ready(target: Target, path: str, timeout_s: float) -> None:
    """Polls `path` until it answers 200; raises with the log's tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if target.proc is not None and target.proc.poll() is not None:
                raise TargetExited(f"{target.name} exited with {target.proc.returncode}:\n{_tail(target.log)}")
            try:
                if client.get(target.base_url + path).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"{target.name} not ready after {timeout_s:.0f} s:\n{_tail(target.log)}")


def stop(target: Target) -> None:
    proc = target.proc
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _tail(log: Path | None, n: int = 30) -> str:
    if log is None or not log.exists():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
