"""A lean HTTP/1.1 client for the one upstream (vLLM): the proxy's hot path.

httpx spends most of a pass-through request's CPU in httpcore's connection pool (every request scans
every pooled connection, and asks each socket whether it is readable) and in its layers of models
(py-spy and yappi on `faithproxy serve` under the overhead benchmark: benchmarks/performance/). The
proxy talks to a single origin with a handful of request shapes, so this client does only that:

- one asyncio Protocol per connection, parsed by httptools (llhttp, the parser uvicorn uses);
- a LIFO list of idle keep-alive connections (O(1) to take one); a connection the upstream closes
  while idle drops out of the list the moment its `connection_lost` fires;
- a request is one `transport.write` (head and body together);
- the body arrives as the bytes llhttp de-chunked, queued without copies; reading pauses once the
  reader falls 256 KiB behind, so a slow client holds back vLLM instead of the proxy's memory;
- the idle timeout (`read_timeout_s`: the longest silence while the reader waits, the wait for the
  headers included) is one timer per response, not one per chunk.

Errors are UpstreamErrors with the same codes the httpx client gave: CONNECT (unreachable, refused,
or the connection closed before any byte of the response), STALLED (the idle timeout), STREAM_BROKEN
(the connection closed mid-body, or the bytes are not HTTP). A response left before its end closes its
connection, which makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from faithproxy.faithcore.errors import UpstreamError, UpstreamErrorCode

_HIGH_WATER = 256 * 1024  # buffered body bytes at which reading pauses
_LOW_WATER = 64 * 1024  # ... and resumes


class UpstreamResponse:
    """One response: status and headers once `start` returns, then the body as it arrives."""

    __slots__ = (
        "_conn",
        "_chunks",
        "_buffered",
        "_waiter",
        "_error",
        "_timer",
        "_read_timeout",
        "_last",
        "_until_eof",
        "complete",
        "got_bytes",
        "status",
        "headers",
        "_raw_headers",
        "_headers_ready",
        "_released",
    )

    def __init__(self, conn: _Connection, read_timeout: float | None) -> None:
        self._conn = conn
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: UpstreamError | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._read_timeout = read_timeout
        self._last = 0.0
        self._until_eof = False
        self.complete = False
        self.got_bytes = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._headers_ready = False
        self._released = False

    # ---- fed by the connection -----------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None and not self.complete:
            self._error = error
        self._wake()

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _on_headers(self, status: int) -> None:
        self.status = status
        headers: dict[str, str] = {}
        for name, value in self._raw_headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self.headers = headers
        self._raw_headers = []
        self._until_eof = "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")
        self._headers_ready = True
        self._wake()

    def _on_complete(self) -> None:
        self.complete = True
        self._wake()

    def _on_eof(self) -> None:
        """The connection closed: the end of a body read until EOF, an error for anything else."""
        if self.complete:
            return
        if self._headers_ready and self._until_eof:
            self._on_complete()
        elif not self.got_bytes:
            self._fail(UpstreamError("cannot reach upstream: it closed the connection", code=UpstreamErrorCode.CONNECT))
        else:
            self._fail(
                UpstreamError("upstream stream broke: the connection closed", code=UpstreamErrorCode.STREAM_BROKEN)
            )

    # ---- the idle timeout ----------------------------------------------------------------------

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._read_timeout is not None and self._timer is None:
            self._last = loop.time()
            self._timer = loop.call_at(self._last + self._read_timeout, self._check_idle)

    def _check_idle(self) -> None:
        """Fails the response when the reader has waited `read_timeout` with nothing arriving."""
        assert self._read_timeout is not None
        loop = self._conn.loop
        self._timer = None
        if self.complete or self._error is not None:
            return
        due = self._last + self._read_timeout
        if self._waiter is not None and loop.time() >= due:
            where = "before its first byte" if not self._headers_ready else "(no data within the idle timeout)"
            self._fail(UpstreamError(f"upstream stalled {where}", code=UpstreamErrorCode.STALLED))
            return
        self._timer = loop.call_at(max(due, loop.time() + 0.001), self._check_idle)

    async def _wait(self) -> None:
        self._waiter = self._conn.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # ---- read by the caller --------------------------------------------------------------------

    async def start(self) -> None:
        """Waits for the status line and headers."""
        while not self._headers_ready:
            if self._error is not None:
                raise self._error
            await self._wait()
        self._last = self._conn.loop.time()

    async def iter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives (de-chunked, not decoded), every byte buffered when the reader comes
        back joined into one piece."""
        chunks = self._chunks
        conn = self._conn
        while True:
            if chunks:
                if len(chunks) == 1:
                    data = chunks.popleft()
                else:
                    data = b"".join(chunks)
                    chunks.clear()
                if self._buffered > _LOW_WATER and conn.paused:
                    conn.resume()
                self._buffered = 0
                self._last = conn.loop.time()
                yield data
                continue
            if self.complete:
                self._release()
                return
            if self._error is not None:
                raise self._error
            await self._wait()
            self._last = conn.loop.time()

    async def read(self) -> bytes:
        return b"".join([data async for data in self.iter_raw()])

    def _release(self) -> None:
        if not self._released:
            self._released = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._conn.done(self)

    async def aclose(self) -> None:
        """Ends the response: the connection goes back to the pool after a complete body, else closes."""
        if not self._released:
            if not self.complete:
                self._conn.abort()
            self._release()


class _Connection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.paused = False
        self.reusable = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # nothing was asked: a confused upstream; never reuse this connection
            self.abort()
            return
        response.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response._fail(
                UpstreamError(
                    f"upstream stream broke: not HTTP ({type(exc).__name__})", code=UpstreamErrorCode.STREAM_BROKEN
                )
            )
            self.abort()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.response is not None:
            self.response._on_eof()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.response is not None
        self.reusable = self.parser.should_keep_alive()
        self.response._on_headers(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        self.response._on_complete()

    # flow control and lifecycle
    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def done(self, response: UpstreamResponse) -> None:
        if self.response is response:
            self.response = None
            self.resume()
            self.pool.release(self, reuse=response.complete and self.reusable and not self.closed)


class UpstreamPool:
    """Connections to one origin (`base_url`, http or https, with an optional path prefix)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        connect_timeout_s: float = 10.0,
        max_connections: int = 512,
    ) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL must be http(s)://host[:port][/prefix], not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        default_port = self.port == (443 if self.ssl else 80)
        netloc = f"[{self.host}]" if ":" in self.host else self.host
        host_header = netloc if default_port else f"{netloc}:{self.port}"
        fixed = f"Host: {host_header}\r\nAccept: */*\r\nUser-Agent: faithproxy\r\n"
        if api_key:
            fixed += f"Authorization: Bearer {api_key}\r\n"
        self._fixed_headers = fixed
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._all: set[_Connection] = set()
        self._closed = False

    def _head(self, method: str, path: str, content_type: str | None, length: int, extra: str = "") -> bytes:
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._fixed_headers}{extra}"
        if content_type:
            head += f"Content-Type: {content_type}\r\n"
        if method != "GET" or length:
            head += f"Content-Length: {length}\r\n"
        return (head + "\r\n").encode("latin-1")

    async def request(
        self,
        method: str,
        path: str,
        *,
        content: bytes = b"",
        content_type: str | None = "application/json",
        read_timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> UpstreamResponse:
        """Sends the request and returns once the status and headers arrived. The caller reads the body
        and must `aclose()` the response (a complete body hands the connection back for reuse)."""
        if self._closed:
            raise UpstreamError("cannot reach upstream: the client is closed", code=UpstreamErrorCode.CONNECT)
        loop = asyncio.get_running_loop()
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items()) if headers else ""
        payload = self._head(method, path, content_type, len(content), extra) + content
        for attempt in (0, 1):
            await self._slots.acquire()  # released with the response (UpstreamResponse._release)
            try:
                conn, reused = await self._connection()
            except BaseException:
                self._slots.release()
                raise
            response = UpstreamResponse(conn, read_timeout_s)
            conn.response = response
            try:
                assert conn.transport is not None
                conn.transport.write(payload)
                if conn.closed:  # lost between the pool and the write: no connection_lost will come
                    response._on_eof()
                response._arm(loop)
                await response.start()
                return response
            except UpstreamError as exc:
                await response.aclose()
                # A kept-alive connection the upstream closed as we wrote: once more, on a new one.
                stale = reused and not response.got_bytes and exc.code == UpstreamErrorCode.CONNECT
                if not (stale and attempt == 0):
                    raise
            except BaseException:
                await response.aclose()
                raise
        raise AssertionError("unreachable")

    async def _connection(self) -> tuple[_Connection, bool]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, loop), self.host, self.port, ssl=self.ssl
                )
        except TimeoutError as exc:
            raise UpstreamError("cannot reach upstream: ConnectTimeout", code=UpstreamErrorCode.CONNECT) from exc
        except OSError as exc:
            raise UpstreamError("cannot reach upstream: ConnectError", code=UpstreamErrorCode.CONNECT) from exc
        self._all.add(conn)
        return conn, False

    def release(self, conn: _Connection, *, reuse: bool) -> None:
        self._slots.release()
        if reuse and not self._closed:
            self._idle.append(conn)
        else:
            conn.abort()
            self._all.discard(conn)

    def forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()
        self._all.clear()
