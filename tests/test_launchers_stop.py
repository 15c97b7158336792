"""Every launcher stops what it started: `faithproxy demo`, `faithproxy bench shapesworld` and the
overhead benchmark, signalled as operators and scripts signal them (SIGTERM from `timeout`, `docker
stop` or systemd; SIGINT to a process a script started in the background, which bash starts with
SIGINT ignored). The whole process tree below the launcher is recorded by PID before the signal and
must be gone after.

vLLM is replaced by a stand-in so the tests cost seconds, not a model load: either the fast upstream
(it answers like vLLM, so the demo gets as far as serving) or a process that never becomes healthy
and forks a helper (a vLLM still loading: the launcher is waiting when the signal comes). Everything
else is the real command, the real judge and the real `faithproxy serve`. The same with real vLLM is
the integration test at the end.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120  # generous: the tests assert what is left running, never how fast it went

# Runs the `faithproxy` command with `tinyvlm.serve.vllm_command` replaced by a stand-in. argv:
# STANDIN (fast | loading) then the command's own arguments.
WITH_STANDIN_VLLM = r"""
import sys
from faithproxy.benchmarks.tinyvlm import serve

LOADING = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
)

def standin(model_dir, port, served_model_name, extra_args):
    if sys.argv[1] == "loading":
        return [sys.executable, "-c", LOADING]
    return [sys.executable, "-m", "faithproxy.testing", "--port", str(port)]

serve.vllm_command = standin
from faithproxy.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name; None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has ended, it only waits to be reaped


def _tree(root: int) -> set[int]:
    """Every live process below `root` (children in sessions of their own included: they keep their
    parent)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None and fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    below: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return below


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait_for(condition: Callable[[], object], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Launched:
    """A launcher started by a test: its pid, and how to read its output."""

    def __init__(self, argv: list[str], log: Path, *, background_from_script: bool) -> None:
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if background_from_script:
            pid_file = log.with_suffix(".pid")
            script = '"$@" > "$LOG" 2>&1 & echo $! > "$PIDFILE"; wait'
            env |= {"LOG": str(log), "PIDFILE": str(pid_file)}
            self.shell: subprocess.Popen[bytes] | None = subprocess.Popen(
                ["bash", "-c", script, "bash", *argv], cwd=ROOT, env=env
            )
            _wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the script to start it")
            self.pid = int(pid_file.read_text())
            self.process: subprocess.Popen[bytes] | None = None
        else:
            self.shell = None
            with log.open("wb") as out:
                self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            self.pid = self.process.pid
        self.seen: set[int] = set()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_until(self, condition: Callable[[set[int]], bool], what: str) -> set[int]:
        """Waits until `condition(tree)` holds; the launcher must not have exited meanwhile."""

        def ready() -> bool:
            assert _alive(self.pid), f"the launcher exited before {what}:\n{self.output()[-3000:]}"
            tree = _tree(self.pid)
            self.seen |= tree
            return condition(tree)

        _wait_for(ready, what)
        return _tree(self.pid)

    def exit_status(self) -> int | None:
        """The launcher's exit status once it has exited (None when a script started it: bash reaps it)."""
        if self.process is not None:
            return self.process.wait(TIMEOUT_S)
        _wait_for(lambda: not _alive(self.pid), "the launcher to exit")
        return None

    def kill_everything(self) -> None:
        for pid in [self.pid, *self.seen]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in (self.process, self.shell):
            if process is not None:
                process.kill()
                process.wait(TIMEOUT_S)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    started: list[Launched] = []

    def start(*argv: str, background_from_script: bool = False) -> Launched:
        launched = Launched(
            list(argv), tmp_path / f"launcher{len(started)}.log", background_from_script=background_from_script
        )
        started.append(launched)
        return launched

    yield start
    for launched in started:  # whatever a test asserted, nothing it started outlives it
        launched.kill_everything()


def _assert_all_gone(pids: set[int]) -> None:
    # SIGKILL to a process group lands asynchronously: give it a moment (not a timing check).
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {pid: _cmdline(pid) for pid in pids if _alive(pid)}
    assert left == {}, f"left running: {left}"


def _standin(kind: str, *command: str) -> list[str]:
    return [sys.executable, "-c", WITH_STANDIN_VLLM, kind, *command]


def _has(fragment: str) -> Callable[[set[int]], bool]:
    return lambda tree: any(fragment in _cmdline(pid) for pid in tree)


def test_sigterm_to_the_demo_serving_stops_vllm_the_judge_and_the_proxy(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    demo = launch(*_standin("fast", "demo", "--keep", "--questions", "1", "--workdir", str(tmp_path / "demo")))
    _wait_for(lambda: "servers left running" in demo.output() or not _alive(demo.pid), "the demo to serve")
    assert "servers left running" in demo.output(), demo.output()[-3000:]
    tree = _tree(demo.pid)
    for server in ("faithproxy.testing", "judge_server", "faithproxy.cli serve"):
        assert any(server in _cmdline(pid) for pid in tree), (server, [_cmdline(p) for p in tree])
    os.kill(demo.pid, signal.SIGTERM)
    assert demo.exit_status() == 128 + signal.SIGTERM
    _assert_all_gone(tree)


def test_sigint_to_the_demo_started_in_the_background_while_vllm_loads(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    demo = launch(*_standin("loading", "demo", "--workdir", str(tmp_path / "demo")), background_from_script=True)
    tree = demo.wait_until(lambda tree: len(tree) >= 2, "the stand-in vLLM and its helper")
    os.kill(demo.pid, signal.SIGINT)
    demo.exit_status()
    _assert_all_gone(tree | {demo.pid})


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_shapesworld_bench_while_vllm_loads(
    launch: Callable[..., Launched], tmp_path: Path, sig: signal.Signals
) -> None:
    # SIGINT the way a script's background job gets it (ignored at start), SIGTERM directly.
    bench = launch(
        *_standin("loading", "bench", "shapesworld", "--n", "5", "--workdir", str(tmp_path / "bench")),
        background_from_script=sig == signal.SIGINT,
    )
    tree = bench.wait_until(lambda tree: len(tree) >= 2, "the stand-in vLLM and its helper")
    os.kill(bench.pid, sig)
    status = bench.exit_status()
    assert sig == signal.SIGINT or status == 128 + signal.SIGTERM
    _assert_all_gone(tree | {bench.pid})


def test_sigterm_to_the_overhead_benchmark_stops_the_upstream_and_the_proxy(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "faithproxy.benchmarks.performance.overhead", "--no-litellm"]
    argv += ["--requests", "100000", "--workdir", str(tmp_path / "work")]  # still measuring when signalled
    bench = launch(*argv)
    tree = bench.wait_until(lambda tree: _has("faithproxy.testing")(tree) and _has(" serve ")(tree), "both servers")
    os.kill(bench.pid, signal.SIGTERM)
    assert bench.exit_status() == 128 + signal.SIGTERM
    _assert_all_gone(tree)


@pytest.mark.integration
def test_sigterm_to_the_demo_with_real_vllm_leaves_nothing_running(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    if importlib.util.find_spec("vllm") is None:  # found, not imported: its import warns
        pytest.skip("vllm is not installed in this interpreter")
    demo = launch(sys.executable, "-m", "faithproxy.cli", "demo", "--keep", "--questions", "1",
                  "--workdir", str(tmp_path / "demo"))  # fmt: skip
    _wait_for(lambda: "servers left running" in demo.output() or not _alive(demo.pid), "the demo to serve", 600)
    assert "servers left running" in demo.output(), demo.output()[-3000:]
    tree = _tree(demo.pid)
    assert any("vllm.entrypoints" in _cmdline(pid) for pid in tree)
    os.kill(demo.pid, signal.SIGTERM)
    assert demo.exit_status() == 128 + signal.SIGTERM
    _assert_all_gone(tree)
