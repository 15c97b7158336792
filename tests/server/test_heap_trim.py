"""The heap trimmer (server/runtime/heap_trim.py): glibc's malloc_trim on a timer, in a worker thread.

The real malloc_trim hands freed heap back: 32 MiB of small C allocations are freed under one still in
use above them (glibc cannot shrink the heap past a live chunk), RSS stays up until the trimmer runs,
then falls by most of what was freed. The timer runs in the app's lifespan and stops with it; 0 turns
it off, and a C library without malloc_trim only logs.

The pinned mmap threshold, in a fresh interpreter each time (mallopt is process-wide): once a 4 MiB
block has been freed, glibc's dynamic threshold puts the next 512 KiB blocks in the heap; pinned at
128 KiB, every one of them is mmapped.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import subprocess
import sys

import pytest

from faithproxy.server.app import create_app
from faithproxy.server.runtime.heap_trim import HeapTrimmer, fix_mmap_threshold, mallinfo2, malloc_trim
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


# Run in a fresh interpreter: frees one 4 MiB block (mmapped: above any threshold), then holds twenty
# 512 KiB blocks and reports how many of them glibc mmapped (mallinfo2's hblks) and what
# fix_mmap_threshold returned.
LARGE_BLOCKS = """
import ctypes, json, sys
from faithproxy.server.runtime.heap_trim import fix_mmap_threshold, mallinfo2

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
pinned = fix_mmap_threshold(int(sys.argv[1]))
libc.free(libc.malloc(4 << 20))
before = mallinfo2().hblks
held = [libc.malloc(512 << 10) for _ in range(20)]
print(json.dumps({"pinned": pinned, "mmapped": mallinfo2().hblks - before}))
"""


def large_blocks(threshold_bytes: int) -> dict[str, int]:
    run = subprocess.run([sys.executable, "-c", LARGE_BLOCKS, str(threshold_bytes)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_a_pinned_mmap_threshold_keeps_large_blocks_out_of_the_heap() -> None:
    if mallinfo2() is None:
        pytest.skip("no glibc mallinfo2")
    dynamic, pinned = large_blocks(0), large_blocks(128 * 1024)
    print(f"\nmmap threshold: 512 KiB blocks mmapped after a 4 MiB free: dynamic {dynamic}, pinned {pinned}")
    assert dynamic == {"pinned": False, "mmapped": 0}  # glibc raised its threshold past 512 KiB
    assert pinned == {"pinned": True, "mmapped": 20}


def test_the_mmap_threshold_setting_is_bounded_and_zero_leaves_glibc_alone() -> None:
    assert fix_mmap_threshold(0) is False
    assert Settings(upstream_url="http://x", heap_mmap_threshold_bytes=0).heap_mmap_threshold_bytes == 0
    with pytest.raises(ValueError):
        Settings(upstream_url="http://x", heap_mmap_threshold_bytes=64 * MIB)
