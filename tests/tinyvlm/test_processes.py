"""tinyvlm.processes: children start in their own process group, are awaited on a health URL while
watched for an early exit, and are stopped group and all (SIGTERM, then SIGKILL after the grace)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from faithproxy.tinyvlm import processes
from faithproxy.tinyvlm.processes import Child, ChildExited, ChildStartError, answers, free_port, spawn, start

# A stand-in server: GET /health answers 200, anything else 404. Flags: --fork PIDFILE starts a
# grandchild (a long sleep) and writes its pid; --ignore-term ignores SIGTERM; --env NAME prints
# that variable's value to stdout before serving.
SERVER = r"""
import http.server, os, signal, subprocess, sys
args = sys.argv[1:]
port = int(args[0])
if "--ignore-term" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "--fork" in args:
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open(args[args.index("--fork") + 1], "w").write(str(grandchild.pid))
if "--env" in args:
    print("env:", os.environ.get(args[args.index("--env") + 1]), flush=True)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

TIMEOUT_S = 60  # generous: the machine may be busy; the tests assert outcomes, not durations


def _server(tmp_path: Path, *flags: str, grace_s: float = processes.STOP_GRACE_S) -> tuple[Child, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-c", SERVER, str(port), *flags]
    child = start(argv, tmp_path / "server.log", f"{url}/health", name="stand-in", timeout_s=TIMEOUT_S, grace_s=grace_s)
    return child, url


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def test_start_returns_a_healthy_child_in_its_own_session_and_stop_ends_it(tmp_path: Path) -> None:
    child, url = _server(tmp_path)
    try:
        assert child.process.poll() is None
        assert answers(f"{url}/health")
        assert os.getsid(child.pid) == child.pid  # its own session, so its own process group
        assert os.getpgid(child.pid) == child.pid
    finally:
        child.stop()
    assert child.process.returncode == -signal.SIGTERM
    assert not answers(f"{url}/health")


def test_answers_is_false_for_an_error_status_and_a_refused_connection(tmp_path: Path) -> None:
    with _server(tmp_path)[0] as child:
        assert not answers(f"http://127.0.0.1:{child.process.args[3]}/missing")  # 404
    assert not answers(f"http://127.0.0.1:{free_port()}/health")  # nothing listens


def test_a_child_that_exits_is_reported_with_its_code_and_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('cannot bind'); sys.exit(3)"]
    with pytest.raises(ChildExited) as caught:
        start(argv, tmp_path / "dies.log", f"http://127.0.0.1:{free_port()}/health", name="dies", timeout_s=TIMEOUT_S)
    message = str(caught.value)
    assert message.startswith("dies exited with 3")
    assert "cannot bind" in message and str(tmp_path / "dies.log") in message


def test_a_child_that_never_answers_times_out_and_is_stopped(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(300)"]
    child = spawn(argv, tmp_path / "mute.log", name="mute")
    with pytest.raises(ChildStartError) as caught:
        child.wait_healthy(f"http://127.0.0.1:{free_port()}/health", timeout_s=0.5, poll_s=0.1)
    assert not isinstance(caught.value, ChildExited)
    assert "mute did not answer" in str(caught.value)
    assert child.process.poll() is None  # wait_healthy leaves it running; start() would stop it
    child.stop()
    assert child.process.returncode == -signal.SIGTERM


def test_start_stops_the_child_when_the_wait_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[Child] = []
    real_spawn = processes.spawn

    def recording_spawn(*args: object, **kwargs: object) -> Child:
        spawned.append(real_spawn(*args, **kwargs))  # type: ignore[arg-type]
        return spawned[-1]

    monkeypatch.setattr(processes, "spawn", recording_spawn)
    argv = [sys.executable, "-c", "import time; time.sleep(300)"]
    with pytest.raises(ChildStartError):
        start(argv, tmp_path / "mute.log", f"http://127.0.0.1:{free_port()}/health", name="mute", timeout_s=0.5)
    assert len(spawned) == 1 and spawned[0].process.returncode == -signal.SIGTERM


def test_stop_ends_what_the_child_forked(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    child, _ = _server(tmp_path, "--fork", str(pid_file))
    grandchild = int(pid_file.read_text())
    assert _alive(grandchild)
    child.stop()
    # SIGKILL is delivered asynchronously: give the grandchild a moment to be gone (not a timing check)
    deadline = time.monotonic() + TIMEOUT_S
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    child, _ = _server(tmp_path, "--ignore-term", grace_s=0.5)
    child.stop()
    assert child.process.returncode == -signal.SIGKILL


def test_stop_is_safe_to_repeat_and_on_a_child_that_has_exited(tmp_path: Path) -> None:
    child = spawn([sys.executable, "-c", "pass"], tmp_path / "quick.log", name="quick")
    child.process.wait(TIMEOUT_S)
    child.stop()
    child.stop()
    assert child.process.returncode == 0


def test_env_replaces_the_environment_and_output_goes_to_the_log(tmp_path: Path) -> None:
    child, _ = _server(tmp_path, "--env", "PROCESSES_TEST_VALUE")
    child.stop()
    assert "env: None" in child.log_tail()
    env = {**os.environ, "PROCESSES_TEST_VALUE": "seen"}
    port = free_port()
    argv = [sys.executable, "-c", SERVER, str(port), "--env", "PROCESSES_TEST_VALUE"]
    with start(argv, tmp_path / "env.log", f"http://127.0.0.1:{port}/health", name="env", timeout_s=60, env=env):
        pass
    assert "env: seen" in (tmp_path / "env.log").read_text()


def test_stop_all_stops_every_child_even_when_one_fails(tmp_path: Path) -> None:
    first, _ = _server(tmp_path)
    second = spawn([sys.executable, "-c", "import time; time.sleep(300)"], tmp_path / "second.log", name="second")

    class Broken(Child):
        def stop(self) -> None:
            raise RuntimeError("cannot stop")

    broken = Broken("broken", second.process, second.log_path)
    with pytest.raises(RuntimeError, match="cannot stop"):
        processes.stop_all([first, None, broken])
    assert first.process.returncode == -signal.SIGTERM
    second.stop()
