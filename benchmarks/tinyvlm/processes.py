"""The one way the repo starts, watches and stops the servers it runs as child processes: vLLM,
`faithproxy serve`, the stand-in judge and upstream, LiteLLM, Prometheus.

Every child runs in a session of its own, so it leads its own process group and `Child.stop()` can
signal the group: whatever the child forked goes down with it. Waiting for a child to come up polls
its health URL and, between polls, checks that the child is still running, so a child that crashed
is reported at once, with the tail of its log, instead of after the whole timeout.

A child in its own session gets none of the signals meant for its parent (Ctrl-C reaches the
terminal's foreground group only), so the parent must stop its children itself, however it ends.
`supervised()` makes sure of that: every launcher runs inside it. Within it SIGTERM and SIGHUP (what
`timeout`, `docker stop`, systemd and a closed terminal send) raise `Terminated` in the main thread
instead of killing the process on the spot, SIGINT raises KeyboardInterrupt even where the shell
started the process with SIGINT ignored (`cmd &` in a script), and on the way out, by whatever
exception or none, every child started inside and still running is stopped. Only SIGKILL, which no
process can catch, still leaves children behind.

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
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ContextDecorator, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

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
        with _deferred_signals():  # a stop cut short by a second Ctrl-C would leave the group running
            if self.process.poll() is None:
                _signal_group(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(self.grace_s)
                except subprocess.TimeoutExpired:
                    pass
            _signal_group(self.process.pid, signal.SIGKILL)  # the group id is the child's pid (own session)
            if self.process.poll() is None:
                self.process.wait(5)
            _forget(self)

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
    # No signal may land between the fork and the registration: the child would run unrecorded.
    # The child writes through its own copy of the log descriptor; ours is closed at once.
    with _deferred_signals(), log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        child = Child(name, process, log_path, grace_s)
        _record(child)
    return child


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


# ---- stopping the children with the parent ---------------------------------------------------------

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived inside `supervised()`. A BaseException, like KeyboardInterrupt, so
    that `except Exception` does not swallow it on the way out; `supervised()` turns it into
    `SystemExit(128 + signum)`, the exit status a shell reports for a process ended by that signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _Supervision:
    """The module's one record of open `supervised()` scopes and of the signal handlers they replaced.
    Signal handlers run in the main thread only, so only the main thread defers them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes: list[list[Child]] = []  # children started inside each open scope, innermost last
        self.saved: dict[int, Any] = {}  # signal -> the handler to put back when the outermost scope ends
        self.deferring = 0  # depth of `_deferred_signals()` in the main thread
        self.pending: int | None = None  # a signal that arrived while deferring, raised once that ends


_supervision = _Supervision()


def _exception_for(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _supervision.deferring:
        if _supervision.pending is None:
            _supervision.pending = signum
        return
    raise _exception_for(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _deferred_signals() -> Iterator[None]:
    """Holds back the exceptions of stop signals while the block runs (a spawn and its registration,
    a stop), then raises the first that arrived, even over an exception already on its way out: the
    signal asks for the whole unwind, which that exception might not cause (a retry loop may catch it)."""
    if not _in_main_thread():
        yield
        return
    _supervision.deferring += 1
    try:
        yield
    finally:
        _supervision.deferring -= 1
        if not _supervision.deferring and _supervision.pending is not None:
            signum, _supervision.pending = _supervision.pending, None
            raise _exception_for(signum)


def _record(child: Child) -> None:
    with _supervision.lock:
        if _supervision.scopes:
            _supervision.scopes[-1].append(child)


def _forget(child: Child) -> None:
    with _supervision.lock:
        for scope in _supervision.scopes:
            if child in scope:
                scope.remove(child)


def _install_handlers() -> None:
    for signum in STOP_SIGNALS:
        current = signal.getsignal(signum)
        # SIGINT is taken over even when ignored: a shell starts `cmd &` with SIGINT ignored, and such
        # a process must still stop on it. A hangup someone chose to ignore (nohup) stays ignored.
        if signum == signal.SIGHUP and current == signal.SIG_IGN:
            continue
        _supervision.saved[signum] = current
        signal.signal(signum, _on_signal)


def _restore_handlers() -> None:
    for signum, handler in _supervision.saved.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    _supervision.saved.clear()


class supervised(ContextDecorator):  # noqa: N801 - used as a statement or a decorator, like a function
    """`with supervised(): ...` around a launcher's work, or `@supervised()` on its function:
    SIGINT, SIGTERM and SIGHUP unwind the main thread (KeyboardInterrupt, `Terminated`) instead of
    ending the process where it stands, and on leaving the block, whatever the reason, every child
    `spawn`ed inside and not yet stopped is stopped (the last started first) with its whole process
    group. A `Terminated` leaves as `SystemExit(128 + signum)`. The handlers it replaced are put back
    when the outermost block ends.

    Scopes nest (an inner one stops its own children when it ends). Handlers can only be installed
    from the main thread; entered from another thread, the block still stops its children."""

    def __enter__(self) -> supervised:
        with _supervision.lock:
            outermost = not _supervision.scopes
            _supervision.scopes.append([])
        if outermost and _in_main_thread():
            _install_handlers()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        late: BaseException | None = None
        try:
            with _deferred_signals():
                try:
                    with _supervision.lock:
                        children = list(_supervision.scopes[-1])
                    stop_all(children)
                finally:
                    with _supervision.lock:
                        _supervision.scopes.pop()
                        outermost = not _supervision.scopes
                    if outermost and _in_main_thread():
                        _restore_handlers()
        except (KeyboardInterrupt, Terminated) as caught:
            late = caught
        # A signal that came while the children were being stopped asks for the unwind that is under
        # way already, unless the block was ending normally or by an exception someone might catch.
        if late is not None and not isinstance(exc, (KeyboardInterrupt, Terminated, SystemExit)):
            if isinstance(late, KeyboardInterrupt):
                raise late
            exc = late
        if isinstance(exc, Terminated):
            raise SystemExit(128 + exc.signum) from exc
