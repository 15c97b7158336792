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

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from faithproxy.benchmarks.tinyvlm.processes import Child, ChildExited, free_port, spawn

ROOT = Path(__file__).resolve().parents[2]  # the repo (benchmarks/performance/ is two levels down)
LITELLM_BIN = ROOT / ".venv-litellm" / "bin" / "litellm"
MASTER_KEY = "sk-bench"  # LiteLLM refuses to start without one; every target gets the same header
MODEL = "fake"


@dataclass
class Target:
    """One thing the client sends requests to, and the process behind it (for `direct`, the upstream
    itself; for a proxy, the process whose memory and CPU are the proxy's own)."""

    name: str
    base_url: str
    child: Child | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return None if self.child is None else self.child.process


def _spawn(name: str, argv: list[str], env: dict[str, str], log: Path) -> Child:
    # Its own process group: stopping it signals the whole group (LiteLLM may fork helpers).
    return spawn(argv, log, name=name, env=env, cwd=ROOT)


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
        "faithproxy.testing",
        "--port",
        str(port),
        "--chunks",
        str(chunks),
    ]
    return Target("direct", f"http://127.0.0.1:{port}", _spawn("upstream", argv, _base_env(), log))


def start_faithproxy(
    workdir: Path,
    upstream: str,
    max_concurrent: int,
    *,
    name: str = "faithproxy",
    site: Path | None = None,
    workers: int = 1,
    env_extra: dict[str, str] | None = None,
) -> Target:
    """`faithproxy serve` in off mode. `site`: run another copy of faithproxy, installed there (e.g. the
    code before a change: `pip install --no-deps --target SITE CHECKOUT`), raced as its own target."""
    port = free_port()
    log = workdir / f"{name}.log"
    env = (
        _base_env()
        | {
            "FAITHPROXY_DEFAULT_MODE": "off",
            "FAITHPROXY_DEFAULT_DETECTOR": "none",
            "FAITHPROXY_MAX_CONCURRENT_REQUESTS": str(max_concurrent),
        }
        | (env_extra or {})
    )
    cwd = ROOT
    exe = Path(sys.executable).with_name("faithproxy")
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "faithproxy.cli"]
    if site is not None:
        # The copy comes first on the path; run from the workdir, so the repo's folders are not on it.
        env["PYTHONPATH"] = str(site)
        head, cwd = [sys.executable, "-m", "faithproxy.cli"], workdir
    argv = head + ["serve", "--upstream", upstream, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--log-level", "warning"] + (["--workers", str(workers)] if workers > 1 else [])
    return Target(name, f"http://127.0.0.1:{port}", spawn(argv, log, name=name, env=env, cwd=cwd))


def start_judge(workdir: Path) -> Target:
    """The stand-in judge server (benchmarks/standins/judge_server.py), every sentence faithful: what the
    shadow-checking targets' checks call."""
    port = free_port()
    oracle = workdir / "judge-oracle.json"
    oracle.write_text('{"unfaithful": []}')
    argv = [sys.executable, "-m", "faithproxy.benchmarks.standins.judge_server", "--port", str(port)]
    argv += ["--oracle", str(oracle)]
    return Target("judge", f"http://127.0.0.1:{port}", _spawn("judge", argv, _base_env(), workdir / "judge.log"))


def shadow_env(share: float, judge_url: str) -> dict[str, str]:
    """A faithproxy in off mode that checks `share` of its requests after the fact with the judge at
    `judge_url` (server/shadow/checker.py)."""
    judge = {"name": "judge", "backend": "anthropic", "model": "judge-model", "base_url": judge_url}
    return {
        "FAITHPROXY_SHADOW_SHARE": str(share),
        "FAITHPROXY_SHADOW_DETECTOR": "judge",
        "FAITHPROXY_JUDGES": json.dumps([judge | {"api_key": "sk-bench"}]),
    }


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
    return Target("litellm", f"http://127.0.0.1:{port}", _spawn("litellm", argv, env, log))


def start_ready(start: Callable[[], Target], path: str, timeout_s: float, tries: int = 3) -> Target:
    """Starts a target and waits until `path` answers; one that exits at once is started again on
    another port (ports are picked free here and bound by the child, so another process can win)."""
    for attempt in range(tries):
        target = start()
        try:
            if target.child is not None:
                target.child.wait_healthy(target.base_url + path, timeout_s)
            return target
        except BaseException as exc:
            stop(target)
            if not isinstance(exc, ChildExited) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def stop(target: Target) -> None:
    if target.child is not None:
        target.child.stop()
