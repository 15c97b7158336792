"""Request functions and process probes of the overhead benchmark.

A request function never raises: it returns a `Result` with `error` filled in (a non-200 status, an
error frame, a stream cut before `data: [DONE]`, content other than what the upstream sent, a
transport error). Every response is checked against the text the fast upstream sends, so a target
cannot look fast by answering wrongly.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from faithproxy.benchmarks.performance.overhead_targets import MASTER_KEY, MODEL
from faithproxy.testing import expected_text

try:
    import psutil
except ImportError:  # the /proc fallback below
    psutil = None

_GONE = (OSError, psutil.Error) if psutil is not None else (OSError,)  # a process that ended meanwhile


@dataclass
class Result:
    """One request: `ttft_s` is the time to the first non-empty content delta (streams only)."""

    error: str | None
    total_s: float
    ttft_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def make_client(base_url: str, connections: int) -> httpx.AsyncClient:
    """HTTP/1.1 keep-alive with as many pooled connections as requests in flight (no pool waits)."""
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"authorization": f"Bearer {MASTER_KEY}", "content-type": "application/json"},
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        timeout=httpx.Timeout(120.0, connect=30.0, pool=120.0),
        trust_env=False,
    )


def request_body(*, stream: bool, chunks: int, delay_ms: float = 0.0, hold: bool = False) -> bytes:
    """The same bytes go to every target; the upstream reads `chunks=`, `delay_ms=` and `hold` from
    the text (faithproxy/testing/scripts.py: Counted)."""
    content = f"chunks={chunks}" + (f" delay_ms={delay_ms:g}" if delay_ms else "") + (" hold" if hold else "")
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream, "max_tokens": 64}
    return json.dumps(body).encode()


async def stream_once(
    client: httpx.AsyncClient, body: bytes, chunks: int, on_first: Callable[[], None] | None = None
) -> Result:
    started = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    done = False
    try:
        async with client.stream("POST", "/v1/chat/completions", content=body) as response:
            if response.status_code != 200:
                await response.aread()
                return Result(f"HTTP {response.status_code}: {response.text[:200]}", time.perf_counter() - started)
            buffer = b""
            async for data in response.aiter_raw():
                buffer += data.replace(b"\r\n", b"\n")
                *frames, buffer = buffer.split(b"\n\n")
                for frame in frames:
                    for line in frame.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                            continue
                        obj = json.loads(payload)
                        if "error" in obj:
                            return Result(f"error frame: {str(obj['error'])[:200]}", time.perf_counter() - started)
                        for choice in obj.get("choices") or ():
                            text = (choice.get("delta") or {}).get("content")
                            if text:
                                if ttft is None:
                                    ttft = time.perf_counter() - started
                                    if on_first is not None:
                                        on_first()
                                parts.append(text)
    except (httpx.HTTPError, ValueError) as exc:
        return Result(f"{type(exc).__name__}: {exc}"[:200], time.perf_counter() - started, ttft)
    total = time.perf_counter() - started
    if not done:
        return Result("stream ended without [DONE]", total, ttft)
    if "".join(parts) != expected_text(chunks):
        return Result("content differs from what the upstream sent", total, ttft)
    return Result(None, total, ttft)


async def complete_once(client: httpx.AsyncClient, body: bytes, chunks: int) -> Result:
    started = time.perf_counter()
    try:
        response = await client.post("/v1/chat/completions", content=body)
        total = time.perf_counter() - started
        if response.status_code != 200:
            return Result(f"HTTP {response.status_code}: {response.text[:200]}", total)
        content = response.json()["choices"][0]["message"]["content"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return Result(f"{type(exc).__name__}: {exc}"[:200], time.perf_counter() - started)
    if content != expected_text(chunks):
        return Result("content differs from what the upstream sent", total)
    return Result(None, total)


# ---- the proxy's process: memory and CPU ----------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """The process and all its descendants (LiteLLM may run helpers)."""
    if psutil is not None:
        try:
            proc = psutil.Process(pid)
            return [pid] + [child.pid for child in proc.children(recursive=True)]
        except _GONE:
            return []
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() else []
            todo += [int(c) for c in children]
    return pids


def rss_bytes(pid: int) -> int:
    total = 0
    for p in _tree(pid):
        try:
            if psutil is not None:
                total += psutil.Process(p).memory_info().rss
            else:
                for line in Path(f"/proc/{p}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except _GONE:
            continue
    return total


def _process_cpu_clock(pid: int) -> float:
    """CPU time of one process (all its threads, ended ones too) in seconds to the nanosecond, from
    its POSIX CPU clock. The clock id is what glibc's clock_getcpuclockid(3) makes on Linux: the pid's complement
    shifted by 3, with CPUCLOCK_SCHED (2) in the low bits. /proc's utime and stime count clock ticks
    (10 ms), so a short window of a fast proxy read 0.0 there."""
    return time.clock_gettime(((~pid) << 3) | 2)


def _ticks_cpu(pid: int) -> float:
    if psutil is not None:
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process tree so far: the nanosecond CPU clock of each process
    where the kernel has one, its tick counts otherwise (a process that has ended meanwhile counts 0)."""
    total = 0.0
    for p in _tree(pid):
        try:
            total += _process_cpu_clock(p)
        except OSError:  # no such clock here (not Linux), or the process has just ended
            try:
                total += _ticks_cpu(p)
            except _GONE:
                continue
    return total
