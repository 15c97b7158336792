"""uvicorn's Server with a housekeeping tick once a second instead of ten times a second.

uvicorn wakes its event loop every 100 ms (Server.main_loop) to refresh the Date header, which it does
once a second, and to see whether a signal asked it to stop. Each wake-up costs the process a little
CPU whether or not it serves anything, and on a machine whose caches other processes keep cold (vLLM
on the same cores) a wake-up is not cheap: about 0.1 ms, so 1.2 ms of CPU every idle second
(`faithproxy serve` in front of CPU vLLM, docs/operations.md). Spread over the tokens of a slow
upstream that is a large part of the proxy's CPU per token.

Here the loop wakes once a second, refreshing the Date header each time (uvicorn's own rate), and a
stop signal wakes it at once: shutdown starts as promptly as before.
"""

from __future__ import annotations

import asyncio
from types import FrameType

import uvicorn

TICK_S = 1.0
_TICKS_PER_SECOND = 10  # uvicorn's on_tick counts 100 ms ticks; it refreshes the Date header every 10th


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Server(uvicorn.Server):
    _loop: asyncio.AbstractEventLoop | None = None
    _waiter: asyncio.Future[None] | None = None

    async def main_loop(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            # A multiple of 10 on every tick: on_tick refreshes the Date header each time (once a second).
            counter = (counter + _TICKS_PER_SECOND) % 864000
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(TICK_S, _wake, waiter)
            try:
                if not self.should_exit:  # a signal may have come between on_tick and here
                    await waiter
            finally:
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
