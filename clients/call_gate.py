"""A cap on the verification calls the proxy has open upstream at once, apart from the request limit.

Each request in correct or detect mode makes a judge call per batch of steps and a generator call per
rewrite or self-check: a burst of flagged steps across many requests could open thousands of them at
once, more than the judge's rate limit or vLLM's queue wants. `CallGate` is one semaphore for all of
them (FAITHPROXY_MAX_CONCURRENT_UPSTREAM_CALLS); a call beyond it waits for a slot, and the gate reports
each wait and each slot taken or given back (`on_wait(kind)`, `on_slots(kind, +1 | -1)`: the server
counts them). `install` puts the gate in front of a generator's non-streamed `chat` (rewrites,
self-checks, hidden-state reads) and each judge backend's `complete`; the streams that answer clients are
under the request limit, not here.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

JUDGE = "judge"
GENERATOR = "generator"


class CallGate:
    """At most `limit` calls inside at once (None: no limit; the reports still count the slots)."""

    def __init__(
        self,
        limit: int | None,
        *,
        on_wait: Callable[[str], None] = lambda kind: None,
        on_slots: Callable[[str, int], None] = lambda kind, change: None,
    ) -> None:
        self.limit = limit
        self._semaphore = asyncio.Semaphore(limit) if limit is not None else None
        self._on_wait = on_wait
        self._on_slots = on_slots

    async def call(self, kind: str, call: Callable[[], Awaitable[Any]]) -> Any:
        semaphore = self._semaphore
        if semaphore is None:
            return await self._inside(kind, call)
        if semaphore.locked():
            self._on_wait(kind)
        async with semaphore:
            return await self._inside(kind, call)

    async def _inside(self, kind: str, call: Callable[[], Awaitable[Any]]) -> Any:
        self._on_slots(kind, 1)
        try:
            return await call()
        finally:
            self._on_slots(kind, -1)


def install(gate: CallGate, generator: Any, judges: Iterable[Any]) -> None:
    """The gate in front of `generator.chat` and every judge's `complete` (wrapped on the instances)."""
    chat = generator.chat

    @functools.wraps(chat)
    async def gated_chat(*args: Any, **kwargs: Any) -> Any:
        return await gate.call(GENERATOR, lambda: chat(*args, **kwargs))

    generator.chat = gated_chat
    for judge in judges:
        complete = judge.complete

        @functools.wraps(complete)
        async def gated_complete(*args: Any, __complete: Any = complete, **kwargs: Any) -> Any:
            return await gate.call(JUDGE, lambda: __complete(*args, **kwargs))

        judge.complete = gated_complete
