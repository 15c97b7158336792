"""Starts real vLLM (CPU build) for a local model directory and stops it again.

The flags are the ones measured to work on small CPU machines: KV cache in whole GiB, the engine in
the server process (no multiprocessing), eager mode and the single-process executor; together they
start in about half a minute and hold about 3 GiB. The server runs in its own process group so that
`stop()` also ends anything it spawned.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

SERVED_MODEL_NAME = "fixture-vlm"

CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class VLLMStartError(RuntimeError):
    """vLLM exited or did not become healthy in time; the message ends with its log."""


@dataclass
class VLLMServer:
    """A running vLLM server; `stop()` ends its whole process group."""

    process: subprocess.Popen
    port: int
    model: str
    log_path: Path
    _log_file: object = field(repr=False, default=None)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the server (it shuts its engine down itself), then SIGKILL to whatever is left."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group id is the server's pid
        except ProcessLookupError:
            pass
        if self.process.poll() is None:
            self.process.wait(5)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None

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
    log_path = Path(log_path)
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        vllm_command(Path(model_dir), port, served_model_name, list(extra_args or [])),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **CPU_ENV, **(env or {})},
        start_new_session=True,
    )
    server = VLLMServer(process, port, served_model_name, log_path, log_file)
    deadline = time.monotonic() + health_timeout
    while True:
        if process.poll() is not None:
            server.stop()
            raise VLLMStartError(f"vLLM exited with {process.returncode}; log {log_path}:\n{server.log_tail()}")
        if _healthy(server.base_url):
            return server
        if time.monotonic() > deadline:
            server.stop()
            raise VLLMStartError(f"vLLM not healthy after {health_timeout:.0f}s; log {log_path}:\n{server.log_tail()}")
        time.sleep(1.0)


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
