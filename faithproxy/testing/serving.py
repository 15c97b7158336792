"""Serve an ASGI app (a FakeUpstream, a proxy, a judge stand-in) with uvicorn on a free 127.0.0.1 port,
in the running event loop (`running_app`) or in a thread of its own (`threaded_app`).

For tests, the demo and the benchmarks that need real servers without subprocesses, because they
look inside them (metrics, tasks, counters).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import uvicorn


@contextlib.asynccontextmanager
async def running_app(
    app: Any, host: str = "127.0.0.1", *, on_exit: Callable[[], None] | None = None, **options: Any
) -> AsyncIterator[str]:
    """Yields the server's base URL. The socket is bound first (port 0), so there is no port race;
    `on_exit` runs before shutdown (e.g. to release requests a fault mode keeps hanging). `options`
    go to uvicorn.Config (e.g. `http=server.connections.HTTP_PROTOCOL`, as `faithproxy serve` runs)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, ws="none", lifespan="on", timeout_graceful_shutdown=2, **options
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # raises the startup error
                raise RuntimeError("server stopped during startup")
            await asyncio.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        if on_exit is not None:
            on_exit()
        server.should_exit = True
        await task
        sock.close()


@contextlib.contextmanager
def threaded_app(app: Any, on_exit: Callable[[], None] | None = None) -> Iterator[str]:
    """Serves `app` (uvicorn on 127.0.0.1) from its own thread and event loop; yields its URL.

    The caller's loop then holds only its own tasks, so a task leak of a proxy under test cannot hide
    among (or be confused with) the tasks of a fake server that is deliberately stalling. `on_exit`
    runs in the server's loop before shutdown (e.g. `FakeUpstream.release`).
    """
    started = threading.Event()
    urls: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []
    stop: list[asyncio.Event] = []
    errors: list[BaseException] = []

    async def serve() -> None:
        stop.append(asyncio.Event())
        loops.append(asyncio.get_running_loop())
        async with running_app(app, on_exit=on_exit) as url:
            urls.append(url)
            started.set()
            await stop[0].wait()

    def main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the caller's thread
            errors.append(exc)
            started.set()

    thread = threading.Thread(target=main, name="fake-server", daemon=True)
    thread.start()
    started.wait(30)
    if errors or not urls:
        raise RuntimeError("fake server did not start") from (errors[0] if errors else None)
    try:
        yield urls[0]
    finally:
        loops[0].call_soon_threadsafe(stop[0].set)
        thread.join(30)
