"""The one way the repo starts, watches and stops the servers it runs as child processes: vLLM,
`faithproxy serve`, the stand-in judge and upstream, LiteLLM, Prometheus.

Every child runs in a session of its own, so it leads its own process group and `Child.stop()` can
signal the group: whatever the child forked goes down with it. Waiting for a child to come up polls
its health URL and, between polls, checks that the child is still running, so a child that crashed
is reported at once, with the tail of its log, instead of after the whole timeout.

It lives in tinyvlm because that is the lowest folder its users (tinyvlm's vLLM starter, shapesworld's
demo, the benchmarks, the tests) all import; the product layers (faithcore, clients, detectors,
regenerators, server) start no processes and must not import it.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

STOP_GRACE_S = 10.0  # how long a child has to exit after SIGTERM before its group gets SIGKILL
POLL_S = 0.25

# Health checks go to 127.0.0.1; an HTTP proxy named in the environment must not be asked for them.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now. The child binds it later, so another process can take it
    first: `ChildExited` from `start` is how that shows (see overhead_targets.start_ready)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ChildStartError(RuntimeError):
    """A child did not come up: it exited, or its health URL did not answer in time. The message ends
    with the tail of its log."""


class ChildExited(ChildStartError):
    """The child exited before its health URL answered."""


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether GET `url` answers 200 now."""
    try:
        with _DIRECT.open(url, timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, http.client.HTTPException):  # refused, reset, timed out, an error status, a bad reply
        return False


@dataclass
class Child:
    """A started child process and the file its stdout and stderr go to."""

    name: str  # for messages: what the child is ("vLLM", "faithproxy", ...)
    process: subprocess.Popen[bytes]
    log_path: Path
    grace_s: float = STOP_GRACE_S  # how long `stop()` waits after SIGTERM

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_healthy(self, url: str, timeout_s: float, poll_s: float = POLL_S) -> None:
        """Returns once GET `url` answers 200; raises `ChildExited` as soon as the child has exited,
        `ChildStartError` when `timeout_s` has passed. Leaves the child running either way."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise ChildExited(self._failure(f"exited with {self.process.returncode}"))
            if answers(url):
                return
            if time.monotonic() > deadline:
                raise ChildStartError(self._failure(f"did not answer {url} within {timeout_s:.0f}s"))
            time.sleep(poll_s)

    def stop(self) -> None:
        """SIGTERM to the child's process group; after `grace_s`, or once the child has exited,
        SIGKILL to whatever is left of the group (helpers it forked and did not end). Safe to call
        again, and on a child that has already exited."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.process.pid, signal.SIGKILL)  # the group id is the child's pid (own session)
        if self.process.poll() is None:
            self.process.wait(5)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _failure(self, what: str) -> str:
        return f"{self.name} {what}; log {self.log_path}:\n{self.log_tail()}"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the whole group has exited already
        pass


def spawn(
    argv: Sequence[str],
    log_path: str | Path,
    *,
    name: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    grace_s: float = STOP_GRACE_S,
) -> Child:
    """Starts `argv` in a session of its own, stdout and stderr to `log_path` (truncated), stdin
    closed. `env` is the child's whole environment (None: this process's); `grace_s` is how long
    `stop()` gives it to exit on SIGTERM."""
    log_path = Path(log_path)
    # The child writes through its own copy of the descriptor; ours is closed at once.
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    return Child(name, process, log_path, grace_s)


def start(
    argv: Sequence[str],
    log_path: str | Path,
    health_url: str,
    *,
    name: str,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    grace_s: float = STOP_GRACE_S,
    poll_s: float = POLL_S,
) -> Child:
    """`spawn`, then `wait_healthy`: a child that does not come up (or a wait cut short, e.g. by
    Ctrl-C) is stopped before the error propagates, so no caller is left holding a half-started one."""
    child = spawn(argv, log_path, name=name, env=env, cwd=cwd, grace_s=grace_s)
    try:
        child.wait_healthy(health_url, timeout_s, poll_s)
    except BaseException:
        child.stop()
        raise
    return child


def stop_all(children: Sequence[Child | None]) -> None:
    """Stops every child, the last started first; one that fails to stop does not keep the others
    running (its error is raised after all have been tried)."""
    errors: list[BaseException] = []
    for child in reversed(children):
        if child is None:
            continue
        try:
            child.stop()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
