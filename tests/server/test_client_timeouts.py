"""Hostile clients (issue 33): stalled uploads and slow headers hold no concurrency slot, are answered 408
and closed at the client timeouts, and are counted by reason, while real requests go through; idle
keep-alive connections are closed too. Against the real server (uvicorn with server/admission/connections.py's
protocol, as `faithproxy serve` runs it). Latency under this load is measured by
benchmarks/performance/hostile_clients.py, not asserted here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from faithproxy.server.admission.connections import HTTP_PROTOCOL, ConnectionProtocol, timeout_response
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, running_app
from faithproxy.testing.metrics import metric

TIMEOUT_S = 15.0  # header and body timeouts of the server under test
OUTLASTS_THE_TEST_S = 3600.0  # timeouts that cannot fire while a test runs (pytest stops it at 600 s)
SLOTS = 8  # far fewer concurrency slots than stalled clients: one held slot each would starve the server


def _held_connections() -> int:
    """2,000 stalled uploads and 2,000 slow-header clients (and as many server ends) where the open-file
    limit allows (raised if it can be), else a few hundred of each."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * 2_000 + 512
    if soft < wanted and (hard == resource.RLIM_INFINITY or hard >= wanted):
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    return 2_000 if soft >= wanted else max(100, (soft - 512) // 4)


HELD = _held_connections()
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


@contextlib.asynccontextmanager
async def server(**overrides: Any) -> AsyncIterator[tuple[str, Any]]:
    base = {"client_header_timeout_s": TIMEOUT_S, "client_body_timeout_s": TIMEOUT_S}
    settings = Settings(
        upstream_url="http://vllm.test",
        default_detector="none",
        max_concurrent_requests=SLOTS,
        **{**base, **overrides},
    )
    app = create_app(settings, upstream_transport=FakeUpstream().transport())
    async with running_app(app, http=HTTP_PROTOCOL, backlog=4096) as url:
        yield url, app


async def closed_count(http: httpx.AsyncClient, reason: str) -> float:
    text = (await http.get("/metrics")).text
    return metric(text, "faithproxy_client_connections_closed_total", reason=reason)


async def open_stalled(url: str, first_bytes: bytes, count: int) -> list[tuple[asyncio.StreamReader, Any]]:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    held = []
    for start in range(0, count, 200):  # in batches: the listen backlog is finite
        batch = await asyncio.gather(
            *(asyncio.open_connection(host, port) for _ in range(start, min(count, start + 200)))
        )
        for _, writer in batch:
            writer.write(first_bytes)
        held += batch
    return held


async def answers(held: list[tuple[asyncio.StreamReader, Any]], within_s: float) -> list[bytes]:
    """What each held connection got before the server closed it (read to EOF, bounded in time)."""

    async def read(reader: asyncio.StreamReader) -> bytes:
        return await reader.read()

    try:
        return await asyncio.wait_for(asyncio.gather(*(read(r) for r, _ in held)), within_s)
    finally:
        for _, writer in held:
            writer.close()


async def real_requests(http: httpx.AsyncClient, clients: int, each: int) -> list[int]:
    """`clients` concurrent clients (fewer than the slots, with room for a slot still being released),
    each sending `each` requests one after the other."""

    async def client() -> list[int]:
        return [(await http.post("/v1/chat/completions", content=BODY)).status_code for _ in range(each)]

    return [status for statuses in await asyncio.gather(*(client() for _ in range(clients))) for status in statuses]


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"


STALLS = {  # what each kind of stalled client sends before it stops, and the close it gets
    "stalled_upload": (HEAD + b"content-length: %d\r\n\r\n" % len(BODY) + BODY[:10], "body_timeout"),
    "slow_headers": (HEAD, "header_timeout"),  # headers that never end
    "silent": (b"", "header_timeout"),  # a connection that sends nothing
}


async def test_stalled_clients_hold_no_slot() -> None:
    """HELD stalled uploads and, beside them, HELD slow-header connections (half of them silent), all
    open while real requests go through. The timeouts here outlast the test, so every stalled client is
    still connected when the real requests finish, however slow the machine: the proof needs no clock."""
    counts = {"stalled_upload": HELD, "slow_headers": HELD // 2, "silent": HELD - HELD // 2}
    never = {"client_header_timeout_s": OUTLASTS_THE_TEST_S, "client_body_timeout_s": OUTLASTS_THE_TEST_S}
    async with server(**never) as (url, _), httpx.AsyncClient(base_url=url, timeout=30) as http:
        held = {kind: await open_stalled(url, STALLS[kind][0], n) for kind, n in counts.items()}
        statuses = await real_requests(http, SLOTS // 2, 4)  # no slot is held by the stalled clients
        closed = {reason: await closed_count(http, reason) for reason in ("body_timeout", "header_timeout")}
        for conns in held.values():
            for _, writer in conns:
                writer.close()
    assert statuses == [200] * len(statuses), statuses
    assert closed == {"body_timeout": 0, "header_timeout": 0}, closed


async def test_stalled_clients_are_closed_with_408_at_their_timeout() -> None:
    """The same stalled clients under short timeouts: each is answered 408 and closed, counted by reason."""
    counts = {"stalled_upload": HELD, "slow_headers": HELD // 2, "silent": HELD - HELD // 2}
    async with server() as (url, _), httpx.AsyncClient(base_url=url, timeout=30) as http:
        held = {kind: await open_stalled(url, STALLS[kind][0], n) for kind, n in counts.items()}
        got = {kind: await answers(conns, within_s=TIMEOUT_S + 30) for kind, conns in held.items()}
        closed = {reason: await closed_count(http, reason) for reason in ("body_timeout", "header_timeout")}
    assert closed == {"body_timeout": HELD, "header_timeout": HELD}
    for kind, answers_of_kind in got.items():
        expected = timeout_response(STALLS[kind][1], TIMEOUT_S)
        assert all(answer == expected for answer in answers_of_kind), (kind, {a[:80] for a in answers_of_kind})


async def test_a_response_started_before_the_body_timeout_is_not_followed_by_a_408() -> None:
    """A body over the size limit is answered 413 from its Content-Length; if the client then stalls, the
    body timeout only closes the connection (nothing can be sent after a response)."""
    short = {"max_body_bytes": 100, "client_body_timeout_s": 0.5}
    async with server(**short) as (url, _), httpx.AsyncClient(base_url=url, timeout=30) as http:
        held = await open_stalled(url, HEAD + b"content-length: 1000\r\n\r\n" + b"x" * 10, 1)
        (got,) = await answers(held, within_s=TIMEOUT_S + 30)
        assert got.startswith(b"HTTP/1.1 413") and b" 408 " not in got
        assert await closed_count(http, "body_timeout") == 1


async def test_idle_keep_alive_connections_are_closed_and_counted() -> None:
    async with server(client_idle_timeout_s=0.2) as (url, _), httpx.AsyncClient(base_url=url, timeout=30) as http:
        held = await open_stalled(url, HEAD + b"content-length: %d\r\n\r\n" % len(BODY) + BODY, 1)
        (got,) = await answers(held, within_s=TIMEOUT_S + 30)  # the answer, then the close at idle
        assert got.startswith(b"HTTP/1.1 200") and await closed_count(http, "idle_timeout") >= 1


def test_without_the_app_rules_the_protocol_is_plain_uvicorn() -> None:
    assert ConnectionProtocol._rules is None  # no lifespan state: no timers armed (uvicorn's behaviour)
