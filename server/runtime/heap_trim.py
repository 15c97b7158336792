"""Handing freed heap back to the OS on a timer (issue 33: the soak).

A proxy under long mixed traffic frees almost everything it allocates, yet glibc keeps the freed
chunks inside its arenas (one per thread that ever allocated, up to 8 per core) whenever a live chunk
sits above them: the 75-minute soak saw the heap in use flat at 46-49 MiB while the free heap glibc
held grew from 1 to 24 MiB, and RSS with it (docs/benchmarks.md). `malloc_trim(0)` releases the free
pages of every arena, those in the middle of a heap included (glibc >= 2.8 madvises them away), so RSS
follows the heap in use again. It runs in a worker thread: it takes each arena's lock in turn, which a
thread allocating at that moment waits on, but the event loop never does.

Where the C library has no malloc_trim (musl, macOS) the timer is not started, and the start says so
at INFO (the trim is on by default: a warning at every start of every such server would be noise).

The trim gives back whole free pages only, and the heap glibc holds kept growing around holes: glibc's
mmap threshold is dynamic. A block of 128 KiB or more starts out mmapped, but freeing one raises the
threshold to its size (up to 32 MiB), and from then on blocks that size come from the heap, where blocks
of many sizes (the probe's hidden states, decoded images, large bodies) leave holes between small chunks
that live on. `fix_mmap_threshold` pins the threshold (`mallopt(M_MMAP_THRESHOLD)`, which also turns
the raise off), so large blocks are always mmapped and go back to the OS whole when freed. In the
65-minute soak the heap glibc held grew 0.9 MiB with the pin against 10.3 MiB without; RSS was the same
with the trim on, which gives back those holes' pages (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable

log = logging.getLogger("faithproxy")


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (malloc.h): its own count of the heap."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]  # fmt: skip


def mallinfo2() -> MallInfo2 | None:
    """glibc's heap count now (the soak samples it; the tests count mmapped blocks with it), or None
    where the C library has no mallinfo2 (musl, macOS, glibc before 2.33)."""
    try:
        call = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    call.restype = MallInfo2
    return call()


M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def fix_mmap_threshold(threshold_bytes: int) -> bool:
    """Pins glibc's mmap threshold at `threshold_bytes` for the whole process (0: leave glibc's dynamic
    threshold). Returns whether it took effect; False where the C library has no mallopt, or refused."""
    if threshold_bytes <= 0:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.info("this C library has no mallopt: FAITHPROXY_HEAP_MMAP_THRESHOLD_BYTES has no effect")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, threshold_bytes) != 1:  # glibc refuses a size it cannot honour
        log.warning("glibc refused an mmap threshold of %d bytes; its dynamic threshold stays", threshold_bytes)
        return False
    return True


class HeapTrimmer:
    """Calls malloc_trim(0) every `interval_s` seconds in a worker thread while started."""

    def __init__(self, interval_s: float, trim: Callable[[int], int] | None = None) -> None:
        self.interval_s = interval_s
        self.trim = trim if trim is not None else malloc_trim()
        self.trims = 0  # calls made
        self.released = 0  # calls that gave memory back (malloc_trim returned 1)
        self.seconds = 0.0  # time spent in them, all together
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval_s <= 0:
            return
        if self.trim is None:
            log.info("this C library has no malloc_trim: FAITHPROXY_HEAP_TRIM_INTERVAL_S has no effect")
            return
        self._task = asyncio.create_task(self._run(), name="heap-trim")

    async def trim_once(self) -> None:
        assert self.trim is not None
        started = time.perf_counter()
        released = await asyncio.to_thread(self.trim, 0)
        self.seconds += time.perf_counter() - started
        self.trims += 1
        self.released += released == 1

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.trim_once()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
            self._task = None
