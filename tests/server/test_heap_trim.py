"""The heap trimmer (server/heap_trim.py): glibc's malloc_trim on a timer, in a worker thread.

The real malloc_trim hands freed heap back: 32 MiB of small C allocations are freed under one still in
use above them (glibc cannot shrink the heap past a live chunk), RSS stays up until the trimmer runs,
then falls by most of what was freed. The timer runs in the app's lifespan and stops with it; 0 turns
it off, and a C library without malloc_trim only logs.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging

import pytest

from faithproxy.server.app import create_app
from faithproxy.server.heap_trim import HeapTrimmer, malloc_trim
from faithproxy.server.settings import Settings
from faithproxy.testing import running_app

MIB = 1 << 20


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * 4096 / MIB


LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]
LIBC.free.argtypes = [ctypes.c_void_p]


def freed_under_a_live_chunk(total_mib: int) -> int:
    """Allocates `total_mib` in 1 KiB chunks, touches them, frees all but the last; returns the last."""
    libc = LIBC
    chunks = [libc.malloc(1024) for _ in range(total_mib * 1024)]
    for chunk in chunks:
        ctypes.memset(chunk, 1, 1024)
    for chunk in chunks[:-1]:
        libc.free(chunk)
    return chunks[-1]


async def test_a_trim_hands_freed_heap_back() -> None:
    if malloc_trim() is None:
        pytest.skip("this C library has no malloc_trim")
    trimmer = HeapTrimmer(60.0)
    await trimmer.trim_once()  # whatever earlier tests left free goes first
    before = rss_mib()
    pinned = freed_under_a_live_chunk(32)
    held = rss_mib()
    await trimmer.trim_once()
    after = rss_mib()
    LIBC.free(pinned)
    print(f"\nheap trim: RSS {before:.0f} -> {held:.0f} MiB with 32 MiB freed, {after:.0f} MiB after one trim")
    assert held - before >= 24, (before, held)  # freed, yet still resident
    assert held - after >= 0.75 * (held - before), (before, held, after)
    assert trimmer.trims == 2 and trimmer.released >= 1 and trimmer.seconds > 0


async def test_the_app_trims_on_its_timer_and_stops_with_its_lifespan() -> None:
    app = create_app(Settings(upstream_url="http://127.0.0.1:9", heap_trim_interval_s=0.05))
    async with running_app(app):
        trimmer = app.state.heap_trimmer
        for _ in range(200):  # up to 10 s on a loaded machine; about 0.1 s when quiet
            if trimmer.trims >= 2:
                break
            await asyncio.sleep(0.05)
        assert trimmer.trims >= 2
    stopped = trimmer.trims
    await asyncio.sleep(0.2)
    assert trimmer.trims == stopped and trimmer._task is None


async def test_zero_never_trims_and_a_libc_without_malloc_trim_only_logs(caplog: pytest.LogCaptureFixture) -> None:
    off = HeapTrimmer(0.0, trim=lambda pad: pytest.fail("trimmed with the interval at 0"))
    off.start()
    assert off._task is None
    missing = HeapTrimmer(0.05)
    missing.trim = None
    with caplog.at_level(logging.INFO, logger="faithproxy"):
        missing.start()
    assert missing._task is None and "no malloc_trim" in caplog.text
    await off.stop()
    await missing.stop()
