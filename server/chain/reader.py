"""Reads one upstream stream ("round") into the correction machine, running ahead of verification.

The reader is its own task so that decoding never waits for the detector: while step k is being
checked, step k+1 is already being read. It only moves data: chunks from the upstream client, read as
events by the door's wire reader (faithcore/correction/wire.py), into the machine, which segments and
decides. It wakes the session when the machine says an event gave it something to do (a step completed,
the round ended), not once per token. The session cancels the task (which closes the HTTP connection,
and vLLM aborts the generation) when a round is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faithproxy.clients.vllm import CHAT_PATH, VLLMClient
from faithproxy.faithcore.correction import ChainMachine, RoundFailed
from faithproxy.faithcore.correction.wire import ChatChunkReader
from faithproxy.faithcore.errors import FaithproxyError

log = logging.getLogger(__name__)


@dataclass
class RoundReader:
    """Streams `body` into `core` as round number `round` of the request; `wake` tells the session.

    The machine may have moved on to a later round before this task is cancelled (it decides while the
    session is still delivering what it emitted): events of a round that is no longer the machine's
    current one are not fed."""

    generator: VLLMClient
    body: dict[str, Any]
    core: ChainMachine
    round: int
    wake: Callable[[], None]
    path: str = CHAT_PATH  # the door's upstream path
    wire: Callable[[], ChatChunkReader] = ChatChunkReader  # the door's wire reader

    async def run(self) -> None:
        core, wire = self.core, self.wire()
        try:
            async with self.generator.stream_chat(self.body, path=self.path) as stream:
                async for batch in stream.batches():  # what one read brought: resumed once, not per token
                    if core.round != self.round:
                        return
                    woke = False
                    for chunk in batch:
                        for event in wire.events(chunk):
                            woke = core.receive(event) or woke
                    if woke:
                        self.wake()
            self._feed_last(wire.end())
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the machine, which owns error policy
            self._feed_last(RoundFailed(_as_faithproxy_error(exc)))

    def _feed_last(self, event: Any) -> None:
        if self.core.round == self.round:
            self.core.receive(event)
        self.wake()


def _as_faithproxy_error(exc: BaseException) -> FaithproxyError:
    if isinstance(exc, FaithproxyError):
        return exc
    # not an upstream failure the client code names: a bug, whose traceback must not be lost
    log.error("internal error while reading upstream", exc_info=exc)
    return FaithproxyError(f"internal error while reading upstream: {type(exc).__name__}")
