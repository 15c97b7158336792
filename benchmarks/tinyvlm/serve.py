"""Starts real vLLM (CPU build) for a local model directory and stops it again.

The flags are the ones measured to work on small CPU machines: KV cache in whole GiB, the engine in
the server process (no multiprocessing), eager mode and the single-process executor; together they
start in about half a minute and hold about 3 GiB. Starting, waiting for /health and stopping are
`tinyvlm.processes`'s, so `stop()` also ends anything the server spawned.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.benchmarks.tinyvlm.processes import Child, ChildStartError, free_port

__all__ = ["SERVED_MODEL_NAME", "VLLMServer", "VLLMStartError", "free_port", "start_vllm", "vllm_command"]

SERVED_MODEL_NAME = "fixture-vlm"

CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def vllm_command(model_dir: Path, port: int, served_model_name: str, extra_args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--distributed-executor-backend",
        "uni",
        "--seed",
        "0",
        "--enable-prefix-caching",
        # Prefix caching reuses whole KV blocks only. The CPU default block is 128 tokens, longer than
        # the fixture prompts (54-180 tokens), so nothing would ever hit; 32 is the smallest the CPU
        # attention kernel accepts (16 fails: "No common block size ... MultipleOf(32)").
        "--block-size",
        "32",
        # The weights are float32 and vLLM's CPU backend would downcast them to bfloat16: keep float32
        # so that its arithmetic stays close to transformers' (parity tests, hidden-state probes).
        "--dtype",
        "float32",
        *extra_args,
    ]


# What `start_vllm` raises when vLLM exits or does not become healthy in time (the message ends with its log).
VLLMStartError = ChildStartError


@dataclass
class VLLMServer:
    """A running vLLM server; `stop()` ends its whole process group."""

    child: Child
    port: int
    model: str

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.child.process

    @property
    def log_path(self) -> Path:
        return self.child.log_path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    def log_tail(self, chars: int = 6000) -> str:
        return self.child.log_tail(chars)

    def stop(self) -> None:
        self.child.stop()

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_vllm(
    model_dir: str | Path,
    port: int | None = None,
    extra_args: list[str] | None = None,
    *,
    served_model_name: str = SERVED_MODEL_NAME,
    health_timeout: float = 180.0,
    log_path: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> VLLMServer:
    """Starts `python -m vllm.entrypoints.openai.api_server` and waits until GET /health answers 200.

    Runs with the current interpreter, so call it from the virtualenv that has vllm-cpu installed.
    """
    port = port or free_port()
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="vllm-", suffix=".log")
        os.close(fd)
        log_path = name
    child = processes.start(
        vllm_command(Path(model_dir), port, served_model_name, list(extra_args or [])),
        log_path,
        f"http://127.0.0.1:{port}/health",
        name="vLLM",
        timeout_s=health_timeout,
        env={**os.environ, **CPU_ENV, **(env or {})},
        grace_s=20.0,  # on SIGTERM vLLM shuts its engine down itself, which takes a while
        poll_s=1.0,
    )
    return VLLMServer(child, port, served_model_name)
