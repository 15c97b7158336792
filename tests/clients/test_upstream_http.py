"""The lean upstream client (clients/upstream_http.py) against raw TCP servers on 127.0.0.1 that send
exactly the bytes each case needs: bodies by length, chunked and until EOF; keep-alive reuse and a
connection the server closed while idle; stalls, cuts, refusals; closing early; flow control."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from faithproxy.clients.upstream_http import UpstreamPool
from faithproxy.faithcore.errors import UpstreamError, UpstreamErrorCode

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]
GUARD_S = 30.0  # ends a wait for something the case expects (the server seeing the client hang up) as a failure
# Idle limits for a silence that must end the read, shortest first. The same limit bounds the wait for the
# response's first bytes, which the servers here send at once: a run in which a loaded machine held them up
# past it proves nothing about what comes after, and is repeated with the next limit.
STALL_LIMITS_S = (0.2, 0.4, 0.8, 1.6, 3.2)


@dataclass
class Server:
    url: str
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)  # each request's head and body, as received
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)


async def read_request(reader: asyncio.StreamReader, server: Server) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = await reader.readexactly(length) if length else b""
    server.requests.append(head + body)
    return body


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    server = Server("")

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            await handler(reader, writer, server)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    tcp = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/prefix"
    try:
        yield server
    finally:
        tcp.close()


async def until(condition: Callable[[], bool], guard_s: float = 30.0) -> None:
    """Returns once `condition()` holds, polling; the guard turns a wait that never ends into a failure
    (it bounds the wait, it measures nothing: a loaded machine only makes the wait longer)."""
    async with asyncio.timeout(guard_s):
        while True:  # the pool's state changes in its own callbacks: no event to wait on
            if condition():
                return
            await asyncio.sleep(0.005)


def response(body: bytes, *, status: str = "200 OK", content_type: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + content_type
    return head + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def chunked(*pieces: bytes, end: bool = True) -> bytes:
    out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    for piece in pieces:
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + (b"0\r\n\r\n" if end else b"")


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
    """Answers every request on the connection with its own body echoed back."""
    while (body := await read_request(reader, server)) is not None:
        writer.write(response(b"echo:" + body))
        await writer.drain()


async def test_requests_reuse_one_kept_alive_connection_and_carry_the_headers() -> None:
    async with serving(keep_alive) as server:
        pool = UpstreamPool(server.url, api_key="sk-up")
        for i in range(3):
            res = await pool.request("POST", "/v1/chat/completions", content=f'{{"n":{i}}}'.encode())
            assert (res.status, res.headers["content-type"]) == (200, "application/json")
            assert await res.read() == f'echo:{{"n":{i}}}'.encode()
            await res.aclose()
        await pool.aclose()
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /prefix/v1/chat/completions HTTP/1.1\r\n")
    assert b"Authorization: Bearer sk-up\r\n" in first and b"Content-Type: application/json\r\n" in first
    assert first.endswith(b'\r\n\r\n{"n":0}')


async def test_chunked_body_is_handed_over_dechunked_as_it_arrives() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        whole = chunked(b"data: 1\n\n", b"data: 2\n\n")
        writer.write(whole[: whole.index(b"data: 2") - 4])  # the head and the first chunk only
        await writer.drain()
        await release.wait()
        writer.write(whole[whole.index(b"data: 2") - 4 :])
        await writer.drain()
        await read_request(reader, server)  # keep the connection until the client is done

    async with serving(handler) as server:
        pool = UpstreamPool(server.url)
        res = await pool.request("POST", "/v1/chat/completions", content=b"{}", read_timeout_s=5)
        pieces = res.iter_raw()
        assert await anext(pieces) == b"data: 1\n\n"  # before the rest was even sent
        release.set()
        assert [p async for p in pieces] == [b"data: 2\n\n"]
        assert res.complete
        await res.aclose()
        await pool.aclose()


async def test_body_until_eof_ends_with_the_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async with serving(handler) as server:
        pool = UpstreamPool(server.url)
        res = await pool.request("GET", "/health", content_type=None)
        assert await res.read() == b"all of it"
        await res.aclose()
        await pool.aclose()


async def test_a_connection_closed_while_idle_is_not_used_again() -> None:
    async def one_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        body = await read_request(reader, server)
        writer.write(response(b"ok:" + (body or b"")))
        await writer.drain()
        # then close without `connection: close`: like a keep-alive timeout on the server's side

    async with serving(one_per_connection) as server:
        pool = UpstreamPool(server.url)
        for i in range(3):
            res = await pool.request("POST", "/x", content=str(i).encode())
            assert await res.read() == f"ok:{i}".encode()
            await res.aclose()
            await until(lambda: pool._idle == [])  # the close reached the pool: the connection left its list
        await pool.aclose()
    assert server.connections == 3


async def test_a_stale_connection_that_closes_as_the_request_goes_out_is_retried_once() -> None:
    """The server took the request on a kept-alive connection but closed it without a byte (a
    keep-alive timeout racing the request): the request goes again on a new connection."""
    async with serving(keep_alive) as server:
        pool = UpstreamPool(server.url)
        res = await pool.request("POST", "/x", content=b"1")
        await res.read()
        await res.aclose()
        (conn,) = pool._idle
        conn.closed = False
        handler_connections = server.connections

        # Make the kept-alive connection look alive but have the server drop it once written to.
        original = conn.transport.write

        def write_then_drop(data: bytes) -> None:
            original(data)
            conn.transport.abort()

        conn.transport.write = write_then_drop  # type: ignore[method-assign]
        res = await pool.request("POST", "/x", content=b"2")
        assert await res.read() == b"echo:2"
        await res.aclose()
        await pool.aclose()
    assert server.connections == handler_connections + 1


async def test_refused_is_connect() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pool = UpstreamPool(f"http://127.0.0.1:{port}")
    with pytest.raises(UpstreamError) as caught:
        await pool.request("POST", "/x", content=b"{}")
    assert caught.value.code == UpstreamErrorCode.CONNECT
    await pool.aclose()


@pytest.mark.parametrize("when", ["before_headers", "mid_body"])
async def test_a_silence_longer_than_the_read_timeout_is_stalled(when: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        if when == "mid_body":
            writer.write(chunked(b"data: 1\n\n", end=False))
            await writer.drain()
        with contextlib.suppress(ConnectionError):
            await reader.read()  # until the client hangs up
        server.closed_by_client.set()

    async with serving(handler) as server:
        pool = UpstreamPool(server.url)
        for limit_s in STALL_LIMITS_S:
            server.closed_by_client.clear()
            res = None
            with pytest.raises(UpstreamError) as caught:
                res = await pool.request("POST", "/x", content=b"{}", read_timeout_s=limit_s)
                async for _ in res.iter_raw():
                    pass
            assert caught.value.code == UpstreamErrorCode.STALLED
            if res is not None:
                await res.aclose()
            await asyncio.wait_for(server.closed_by_client.wait(), GUARD_S)  # the connection was closed
            if when == "before_headers" or res is not None or limit_s == STALL_LIMITS_S[-1]:
                break  # (mid_body: stalled before the headers only where the machine outran the limit)
        assert (res is not None) == (when == "mid_body")  # mid_body: the silence came after the first chunk
        await pool.aclose()


async def test_a_slow_reader_is_not_a_stall() -> None:
    """The idle timeout counts while the reader waits for data, not while it is busy elsewhere: a reader
    busy for longer than the limit gets the whole body. (The limit also bounds the wait for the headers:
    a run in which a loaded machine held them up past it is repeated with the next limit.)"""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(chunked(b"a", b"b", b"c"))
        await writer.drain()
        await read_request(reader, server)

    async with serving(handler) as server:
        pool = UpstreamPool(server.url)
        for limit_s in STALL_LIMITS_S:
            try:
                res = await pool.request("POST", "/x", content=b"{}", read_timeout_s=limit_s)
                break
            except UpstreamError as exc:  # stalled before the headers: not yet what this case is about
                if exc.code != UpstreamErrorCode.STALLED or limit_s == STALL_LIMITS_S[-1]:
                    raise
        await asyncio.sleep(2.5 * limit_s)  # busy elsewhere, for longer than the limit
        assert await res.read() == b"abc"
        await res.aclose()
        await pool.aclose()


@pytest.mark.parametrize(("cut", "code"), [("before_any_byte", "connect"), ("mid_body", "stream_broken")])
async def test_a_connection_cut_is_an_upstream_error(cut: str, code: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        if cut == "mid_body":
            writer.write(chunked(b"data: 1\n\n", end=False))
            await writer.drain()
        writer.transport.abort()

    async with serving(handler) as server:
        pool = UpstreamPool(server.url)
        with pytest.raises(UpstreamError) as caught:
            res = await pool.request("POST", "/x", content=b"{}", read_timeout_s=5)
            async for _ in res.iter_raw():
                pass
        assert caught.value.code == code
        await pool.aclose()


async def test_not_http_is_stream_broken() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with serving(handler) as server:
        pool = UpstreamPool(server.url)
        with pytest.raises(UpstreamError) as caught:
            await pool.request("POST", "/x", content=b"{}", read_timeout_s=5)
        assert caught.value.code == UpstreamErrorCode.STREAM_BROKEN
        await pool.aclose()


async def test_closing_before_the_end_hangs_up_and_the_connection_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(chunked(b"data: 1\n\n", end=False))
        await writer.drain()
        await reader.read()  # EOF: the client hung up, as vLLM sees an aborted generation
        server.closed_by_client.set()

    async with serving(handler) as server:
        pool = UpstreamPool(server.url)
        res = await pool.request("POST", "/x", content=b"{}", read_timeout_s=5)
        assert await anext(res.iter_raw()) == b"data: 1\n\n"
        await res.aclose()
        await asyncio.wait_for(server.closed_by_client.wait(), GUARD_S)
        assert pool._idle == []
        await pool.aclose()


async def test_reading_pauses_while_the_reader_lags_and_every_byte_arrives() -> None:
    pieces = [bytes([65 + i % 26]) * 65536 for i in range(16)]  # 1 MiB, far over the high-water mark

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(chunked(*pieces))
        await writer.drain()
        await read_request(reader, server)

    async with serving(handler) as server:
        pool = UpstreamPool(server.url)
        res = await pool.request("POST", "/x", content=b"{}", read_timeout_s=5)
        await until(lambda: res._conn.paused)  # the server writes everything it can meanwhile
        paused_while_lagging = res._conn.paused
        assert await res.read() == b"".join(pieces)
        assert paused_while_lagging and not res._conn.paused
        await res.aclose()
        await pool.aclose()


async def test_error_statuses_come_back_as_they_are() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await read_request(reader, server)
        writer.write(response(b'{"error":{"message":"no"}}', status="400 Bad Request"))
        await writer.drain()
        await read_request(reader, server)

    async with serving(handler) as server:
        pool = UpstreamPool(server.url)
        res = await pool.request("POST", "/x", content=b"{}")
        assert res.status == 400 and await res.read() == b'{"error":{"message":"no"}}'
        await res.aclose()
        await pool.aclose()
