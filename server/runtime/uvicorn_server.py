"""uvicorn's Server without a housekeeping tick: the event loop wakes only for work.

uvicorn wakes its event loop every 100 ms (Server.main_loop) to refresh the Date header, which it does
once a second, and to see whether a signal asked it to stop. Each wake-up costs the process CPU whether
or not it serves anything, and on a machine whose caches other processes keep cold (vLLM on the same
cores) a wake-up is not cheap: 0.1 to 0.5 ms, the colder the rarer (docs/benchmarks.md). Spread over
the tokens of a slow upstream that is a large part of the proxy's CPU per token.

Here nothing wakes the loop on a timer:

- the Date header is made when it is read (`DatedServerState`): each response gets the date of the
  second it starts in, as uvicorn's once-a-second refresh gave it, at the cost of a clock read per
  request;
- a stop signal wakes the loop at once (`handle_exit`), so shutdown starts without waiting for a tick.

Only the settings that need uvicorn's periodic check (`limit_max_requests`, `callback_notify`, neither
of which `faithproxy serve` sets) bring back a tick, once a second.

`serve --workers N` runs this Server in each worker too (server/runtime/supervisor.py).
"""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate
from types import FrameType

import uvicorn
from uvicorn.server import ServerState

TICK_S = 1.0
_TICKS_PER_SECOND = 10  # uvicorn's on_tick counts 100 ms ticks; it refreshes the Date header every 10th


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class DatedServerState(ServerState):
    """uvicorn's state shared by its connections, whose `default_headers` (read once per request) carry
    the Date of the second they are read in, followed by the configured headers.

    uvicorn's own assignments to `default_headers` (in ServerState.__init__ and on_tick) are
    superseded: the list is always made from the config.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        self._config = config
        self._second = -1
        self._headers: list[tuple[bytes, bytes]] = []
        super().__init__()

    @property  # type: ignore[override] # a plain attribute in ServerState
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        now = int(time.time())
        if now != self._second:
            self._second = now
            config = self._config
            date = [(b"date", formatdate(now, usegmt=True).encode())] if config.date_header else []
            self._headers = date + config.encoded_headers  # encoded by Config.load, after __init__
        return self._headers

    @default_headers.setter
    def default_headers(self, value: list[tuple[bytes, bytes]]) -> None:
        self._second = -1  # made afresh at the next read


class Server(uvicorn.Server):
    _loop: asyncio.AbstractEventLoop | None = None
    _waiter: asyncio.Future[None] | None = None

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.server_state = DatedServerState(config)

    @property
    def ticks(self) -> bool:
        """Whether the loop must still wake once a second: for uvicorn's request limit or its
        notification callback (the supervisor of its own workers)."""
        return self.config.limit_max_requests is not None or self.config.callback_notify is not None

    async def main_loop(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            # A multiple of 10 on every tick: what on_tick does once a second it does each time.
            counter = (counter + _TICKS_PER_SECOND) % 864000
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(TICK_S, _wake, waiter) if self.ticks else None
            try:
                if not self.should_exit:  # a signal may have come between on_tick and here
                    await waiter
            finally:
                if timer is not None:
                    timer.cancel()
                self._waiter = None
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        loop, waiter = self._loop, self._waiter
        if loop is not None and waiter is not None and not loop.is_closed():
            # The handler runs between two bytecodes of whatever the loop was doing: hand the wake-up
            # to the loop rather than touch the future from here.
            loop.call_soon_threadsafe(_wake, waiter)


def run(app: object, **config: object) -> bool:
    """uvicorn.run(app, **config) for one process with this Server; False when the server never started
    (uvicorn.run exits with its STARTUP_FAILURE status then; the caller decides)."""
    server = Server(uvicorn.Config(app, **config))  # type: ignore[arg-type]
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl-C while stopping
        pass
    return server.started
