"""tinyvlm.processes: children start in their own process group, are awaited on a health URL while
watched for an early exit, and are stopped group and all (SIGTERM, then SIGKILL after the grace)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.benchmarks.tinyvlm.processes import (
    Child,
    ChildExited,
    ChildStartError,
    answers,
    free_port,
    spawn,
    start,
)

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


# ---- supervised(): the children stop with the parent ----------------------------------------------

# A child that forks a grandchild and writes "child grandchild" to its pid file, then waits.
FORKING_CHILD = r"""
import os, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {grandchild.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"""

# A launcher as the repo's are written: children started inside `supervised()`. It writes whether
# SIGINT was ignored when it started, waits until both children have written their pid files, says
# "ready", then waits (or, with "fail", raises as a launcher that breaks would).
LAUNCHER = r"""
import signal, sys, time
from pathlib import Path
from faithproxy.benchmarks.tinyvlm.processes import spawn, supervised
work, how = Path(sys.argv[1]), sys.argv[2]
(work / "sigint").write_text("ignored" if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else "handled")
# A launcher started from a terminal: a test run under nohup would hand it SIGHUP ignored, which
# supervised() rightly leaves ignored.
signal.signal(signal.SIGHUP, signal.SIG_DFL)
with supervised():
    for n in (1, 2):
        spawn([sys.executable, "-c", sys.argv[3], str(work / f"child{n}.pids")], work / f"child{n}.log", name=f"c{n}")
    while not all((work / f"child{n}.pids").exists() for n in (1, 2)):
        time.sleep(0.05)
    (work / "ready").write_text("")
    if how == "fail":
        raise RuntimeError("the launcher broke")
    time.sleep(300)
"""


def _launch(tmp_path: Path, how: str = "wait", *, background_from_script: bool = False) -> int:
    """Starts LAUNCHER (directly, or as `cmd &` from a bash script, which ignores SIGINT in it) and
    returns its pid once its children and grandchildren run."""
    argv = [sys.executable, "-c", LAUNCHER, str(tmp_path), how, FORKING_CHILD]
    if background_from_script:
        # Non-interactive bash starts a background command with SIGINT and SIGQUIT ignored.
        script = '"$@" & echo $! > "$PIDFILE"; wait'
        env = {**os.environ, "PIDFILE": str(tmp_path / "launcher.pid")}
        wrapper = processes.spawn(["bash", "-c", script, "bash", *argv], tmp_path / "bash.log", name="bash", env=env)
        _wait_for(lambda: (tmp_path / "launcher.pid").exists() and (tmp_path / "launcher.pid").read_text().strip())
        pid = int((tmp_path / "launcher.pid").read_text())
        _launched.append(wrapper)
    else:
        child = processes.spawn(argv, tmp_path / "launcher.log", name="launcher")
        _launched.append(child)
        pid = child.pid
    _wait_for(lambda: (tmp_path / "ready").exists() or not _alive(pid))
    return pid


_launched: list[Child] = []  # stopped after each test, whatever it asserted


@pytest.fixture(autouse=True)
def _stop_launched() -> object:
    yield
    processes.stop_all(_launched)
    _launched.clear()


def _wait_for(condition: object, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)


def _descendants(tmp_path: Path) -> list[int]:
    return [int(pid) for n in (1, 2) for pid in (tmp_path / f"child{n}.pids").read_text().split()]


def _exit_status(pid: int, tmp_path: Path) -> int | None:
    """The launcher's exit status when this test started it directly (None behind bash)."""
    for child in _launched:
        if child.pid == pid:
            return child.process.wait(TIMEOUT_S)
    _wait_for(lambda: not _alive(pid))
    return None


@pytest.mark.parametrize(
    ("sig", "status"), [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGHUP, 128 + signal.SIGHUP),
                        (signal.SIGINT, -signal.SIGINT)]
)  # fmt: skip
def test_a_signal_to_the_launcher_stops_every_child_and_grandchild(
    tmp_path: Path, sig: signal.Signals, status: int
) -> None:
    pid = _launch(tmp_path)
    pids = _descendants(tmp_path)
    assert all(_alive(p) for p in pids)
    os.kill(pid, sig)
    assert _exit_status(pid, tmp_path) == status  # SIGINT: Python re-raises it after unwinding
    _wait_for(lambda: not any(_alive(p) for p in pids))  # SIGKILL lands asynchronously
    assert [p for p in pids if _alive(p)] == []


def test_sigint_stops_a_launcher_started_in_the_background_from_a_script(tmp_path: Path) -> None:
    pid = _launch(tmp_path, background_from_script=True)
    assert (tmp_path / "sigint").read_text() == "ignored"  # the case under test: bash ignored it for us
    pids = _descendants(tmp_path)
    os.kill(pid, signal.SIGINT)
    _wait_for(lambda: not _alive(pid))
    assert not _alive(pid)
    _wait_for(lambda: not any(_alive(p) for p in pids))
    assert [p for p in pids if _alive(p)] == []


def test_a_launcher_that_fails_stops_its_children(tmp_path: Path) -> None:
    pid = _launch(tmp_path, "fail")
    assert _exit_status(pid, tmp_path) == 1
    assert "the launcher broke" in (tmp_path / "launcher.log").read_text()
    pids = _descendants(tmp_path)
    _wait_for(lambda: not any(_alive(p) for p in pids))
    assert [p for p in pids if _alive(p)] == []


def test_supervised_stops_what_was_started_inside_and_puts_the_handlers_back(tmp_path: Path) -> None:
    before = {sig: signal.getsignal(sig) for sig in processes.STOP_SIGNALS}
    outside = spawn([sys.executable, "-c", "import time; time.sleep(300)"], tmp_path / "out.log", name="outside")
    try:
        with pytest.raises(SystemExit) as caught, processes.supervised():
            assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
            inside = spawn([sys.executable, "-c", "import time; time.sleep(300)"], tmp_path / "in.log", name="in")
            stopped = spawn([sys.executable, "-c", "import time; time.sleep(300)"], tmp_path / "s.log", name="s")
            stopped.stop()
            os.kill(os.getpid(), signal.SIGTERM)  # raised as Terminated at the next bytecode
            time.sleep(TIMEOUT_S)
        assert caught.value.code == 128 + signal.SIGTERM
        assert isinstance(caught.value.__cause__, processes.Terminated)
        assert inside.process.returncode == -signal.SIGTERM
        assert outside.process.poll() is None  # started outside the block: not its to stop
        assert {sig: signal.getsignal(sig) for sig in processes.STOP_SIGNALS} == before
    finally:
        outside.stop()


def test_nested_scopes_stop_their_own_children_and_the_outer_keeps_the_handlers(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    with processes.supervised():
        first = spawn(sleeper, tmp_path / "1.log", name="first")
        with processes.supervised():
            second = spawn(sleeper, tmp_path / "2.log", name="second")
        assert second.process.returncode == -signal.SIGTERM
        assert first.process.poll() is None
        assert signal.getsignal(signal.SIGTERM) is processes._on_signal
    assert first.process.returncode == -signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is not processes._on_signal
