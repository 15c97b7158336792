"""When a server the demo starts dies at start, the demo names it, quotes the cause from its log and
says where the log is, instead of a traceback (issue 41: on a plain Debian vLLM died over a missing
libnuma.so.1 and the demo ended in "Engine core initialization failed", the cause only in the log)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from faithproxy.benchmarks.tinyvlm.processes import ChildStartError, free_port, spawn
from faithproxy.demo import start_failure

# What vLLM's engine prints on a machine without libnuma1, in the order it prints it.
DYING = """
import sys
print("INFO 12-04 17:00:00 [api_server.py:1] vLLM API server version 0.32.0", flush=True)
print("(EngineCore pid=9) ERROR 12-04 17:00:01 [core.py:708] ImportError: libnuma.so.1: cannot open shared "
      "object file: No such file or directory", flush=True)
print("(EngineCore pid=9) ERROR 12-04 17:00:01 [core.py:708] AttributeError: '_OpNamespace' '_C' object has no "
      "attribute 'init_cpu_memory_env'", flush=True)
print("Traceback (most recent call last):", flush=True)
print('  File "api_server.py", line 9, in <module>', flush=True)
print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
sys.exit(1)
"""


def test_a_server_that_dies_at_start_is_reported_by_cause_and_log_path(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    child = spawn([sys.executable, "-c", DYING], log, name="vllm")
    with pytest.raises(ChildStartError) as raised:
        child.wait_healthy(f"http://127.0.0.1:{free_port()}/health", 60)
    child.stop()
    printed = start_failure(str(raised.value))
    lines = printed.splitlines()
    assert lines[0].startswith("[demo] failed to start: vllm ") and str(log) in lines[0]
    assert lines[1:] == [
        "[demo] cause:",
        "  ImportError: libnuma.so.1: cannot open shared object file: No such file or directory",
        "  AttributeError: '_OpNamespace' '_C' object has no attribute 'init_cpu_memory_env'",
        "  RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    assert "Traceback" not in printed


def test_a_server_that_never_answers_is_reported_by_the_last_lines_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    child = spawn([sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(60)"], log,
                  name="vllm")  # fmt: skip
    try:
        with pytest.raises(ChildStartError) as raised:
            child.wait_healthy(f"http://127.0.0.1:{free_port()}/health", 2)
    finally:
        child.stop()
    printed = start_failure(str(raised.value))
    assert printed.splitlines()[0].startswith("[demo] failed to start: vllm did not answer")
    assert printed.splitlines()[1:] == ["[demo] cause:", "  loading weights"]
