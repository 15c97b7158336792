"""server/runtime/uvicorn_server.py: uvicorn's server without a housekeeping tick (a stop signal wakes it, the
Date header is made when read, a request limit brings back a once-a-second tick); `faithproxy serve`
runs on it (started, served, stopped by SIGTERM, a bind failure reported)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import uvicorn

from faithproxy.benchmarks.tinyvlm.processes import free_port, spawn
from faithproxy.server.runtime import uvicorn_server


async def _app(scope: dict, receive: object, send: object) -> None:  # never called: no socket is served
    raise AssertionError("not served")


def _server(
    ticks: list[int], reached: asyncio.Event | None = None, count: int = 1, **config: object
) -> uvicorn_server.Server:
    """A server whose ticks are recorded in `ticks`; `reached` is set at the `count`th tick."""
    server = uvicorn_server.Server(uvicorn.Config(_app, lifespan="off", **config))  # type: ignore[arg-type]
    on_tick = server.on_tick

    async def counting(counter: int) -> bool:
        ticks.append(counter)
        if reached is not None and len(ticks) >= count:
            reached.set()
        return await on_tick(counter)

    server.on_tick = counting  # type: ignore[method-assign]
    return server


async def test_a_stop_signal_wakes_the_tick_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn_server, "TICK_S", 3600.0)  # only the signal can end this wait
    ticks: list[int] = []
    first = asyncio.Event()
    server = _server(ticks, first)
    loop = asyncio.get_running_loop()
    main = asyncio.create_task(server.main_loop())
    await first.wait()
    await asyncio.sleep(0)  # the loop is now waiting for its next tick
    assert server._waiter is not None
    loop.call_soon(server.handle_exit, signal.SIGTERM, None)  # as the signal handler runs, between callbacks
    await asyncio.wait_for(main, 30)  # returns: without the wake-up it would sleep for an hour
    assert server.should_exit and ticks == [0, 10]


async def test_a_signal_before_the_wait_is_not_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn_server, "TICK_S", 3600.0)
    ticks: list[int] = []
    server = _server(ticks)
    server.handle_exit(signal.SIGTERM, None)  # no loop, no waiter yet: only the flag is set
    await asyncio.wait_for(server.main_loop(), 30)
    assert ticks == [0]


async def test_nothing_wakes_the_loop_but_a_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn_server, "TICK_S", 0.001)  # were there a tick, it would come at once
    ticks: list[int] = []
    server = _server(ticks)
    main = asyncio.create_task(server.main_loop())
    await asyncio.sleep(0.2)
    assert ticks == [0] and not main.done()
    server.handle_exit(signal.SIGTERM, None)
    await asyncio.wait_for(main, 30)
    assert ticks == [0, 10]


async def test_a_request_limit_brings_the_tick_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn_server, "TICK_S", 0.001)
    ticks: list[int] = []
    fourth = asyncio.Event()
    server = _server(ticks, fourth, 4, limit_max_requests=1_000_000)  # uvicorn checks it on each tick
    main = asyncio.create_task(server.main_loop())
    await asyncio.wait_for(fourth.wait(), 30)
    server.handle_exit(signal.SIGTERM, None)
    await asyncio.wait_for(main, 30)
    assert all(counter % 10 == 0 for counter in ticks)  # what uvicorn does once a second, each time


def test_the_date_header_is_that_of_the_second_it_is_read_in(monkeypatch: pytest.MonkeyPatch) -> None:
    config = uvicorn.Config(_app, lifespan="off", headers=[("x-extra", "1")])
    config.encoded_headers = [(b"server", b"uvicorn"), (b"x-extra", b"1")]  # as Config.load encodes them
    state = uvicorn_server.DatedServerState(config)
    clock = [1_700_000_000.25]
    monkeypatch.setattr(uvicorn_server.time, "time", lambda: clock[0])
    first = state.default_headers
    assert first == [(b"date", b"Tue, 14 Nov 2023 22:13:20 GMT"), (b"server", b"uvicorn"), (b"x-extra", b"1")]
    clock[0] += 0.5
    assert state.default_headers is first  # the same second: made once
    clock[0] += 1
    assert state.default_headers[0] == (b"date", b"Tue, 14 Nov 2023 22:13:21 GMT")
    state.default_headers = []  # uvicorn's own assignment (on_tick) changes nothing that is read
    assert state.default_headers[1:] == [(b"server", b"uvicorn"), (b"x-extra", b"1")]
    config.date_header = False
    state.default_headers = []
    assert state.default_headers == [(b"server", b"uvicorn"), (b"x-extra", b"1")]


def _serve_argv(port: int) -> list[str]:
    # An upstream nobody listens on: the proxy starts all the same (/readyz says so).
    upstream = f"http://127.0.0.1:{free_port()}"
    return [sys.executable, "-m", "faithproxy.cli", "serve", "--upstream", upstream, "--port", str(port)]


def test_serve_answers_then_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAITHPROXY_")}
    log = tmp_path / "serve.log"
    child = spawn([*_serve_argv(port), "--log-level", "info"], log, name="serve", env=env)
    try:
        child.wait_healthy(f"http://127.0.0.1:{port}/healthz", 60)
        response = httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False)
        assert response.status_code == 200 and response.headers["date"].endswith(" GMT")
        child.process.send_signal(signal.SIGTERM)
        # uvicorn shuts down (the lifespan's end included), then re-raises the signal it caught, as
        # uvicorn.run does: the status says SIGTERM, the log says the stop was orderly.
        assert child.process.wait(30) == -signal.SIGTERM
        assert "Application shutdown complete." in log.read_text()
    finally:
        child.stop()


def test_serve_reports_a_port_it_cannot_bind() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAITHPROXY_")}
        done = subprocess.run(
            [*_serve_argv(port), "--log-level", "error"], env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 3  # uvicorn's STARTUP_FAILURE, as uvicorn.run exits with
