"""A real Redis (Debian's `redis-server`, scripts/install_redis.sh) for tests, on a free 127.0.0.1 port.

Nothing is persisted (no RDB, no AOF): a Redis that is stopped and started again comes back empty, on
the same port, the way a crashed cache node would. Started and stopped through `tinyvlm.processes`,
so a test run that is interrupted leaves no server behind.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import redis

from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.benchmarks.tinyvlm.processes import free_port

INSTALL = "bash scripts/install_redis.sh"


def redis_binary() -> str:
    """The redis-server on PATH; fails the test (never skips it) when there is none."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(f"redis-server is not installed: run `{INSTALL}` (scripts/test.sh does)")
    return binary


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.binary = redis_binary()
        self.workdir = workdir
        self.port = free_port()
        self.child: processes.Child | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def start(self, timeout_s: float = 20.0) -> None:
        """Starts it (again, on the same port) and waits until it answers PING."""
        self.starts += 1
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.child = processes.spawn(
            argv, self.workdir / f"redis-{self.starts}.log", name="redis-server", cwd=self.workdir, grace_s=5
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                pass
            if self.child.process.poll() is not None or time.monotonic() > deadline:
                log = self.child.log_tail()
                self.child.stop()
                raise processes.ChildStartError(f"redis-server did not answer PING on {self.port}:\n{log}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None
