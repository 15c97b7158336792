"""Serve an ASGI app with uvicorn on a free 127.0.0.1 port inside the running event loop.

Used by the tests, the demo and the benchmarks to run real servers (faithproxy, local judges, fault
injectors) without subprocesses when they need to look inside them (metrics, tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn


@contextlib.asynccontextmanager
async def running_app(
    app: Any, host: str = "127.0.0.1", *, on_exit: Callable[[], None] | None = None
) -> AsyncIterator[str]:
    """Yields the server's base URL. The socket is bound first (port 0), so there is no port race;
    `on_exit` runs before shutdown (e.g. to release requests a fault mode keeps hanging)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, ws="none", lifespan="on", timeout_graceful_shutdown=2
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
