"""The generator client: vLLM's OpenAI-compatible API.

Chat completions (streamed, and the pass-through of `off` mode) go over the lean HTTP/1.1 client of
clients/upstream_http.py, the proxy's hot path; the rest (model list, health, the non-streamed calls
of regenerations and self-checks) over one pooled httpx.AsyncClient. A test that injects an httpx
transport (`transport=`) gets every call over httpx, through the same response interface
(`UpstreamBody`: status, lower-case headers, `iter_raw`, `read`, `aclose`).

Streams have no whole-request timeout (a long reasoning chain may stream for many minutes); their read
timeout is an idle limit, the longest silence between two reads (`stream_idle_timeout_s`; None: none),
so a stalled vLLM is noticed while a healthy long stream never is. A stall is an UpstreamError with
code "stalled". Closing a stream before its end closes the HTTP connection, which makes vLLM abort the
generation.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from faithproxy.clients.sse import SSEBytesDecoder
from faithproxy.clients.upstream_http import UpstreamPool
from faithproxy.faithcore.errors import UpstreamError, UpstreamErrorCode, UpstreamStatusError

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
# The request's routing key, (header, value), set by the server for the request being served
# (server/admission/affinity.py): every chat call made in that context carries it, so a consistent-hash router
# sends all the calls of one request to one replica. None: no header.
ROUTING_KEY: ContextVar[tuple[str, str] | None] = ContextVar("faithproxy_routing_key", default=None)


class UpstreamBody(Protocol):
    """An upstream response whose status and headers have arrived; the body is read as it comes."""

    status: int
    headers: dict[str, str]  # names in lower case

    def iter_raw(self) -> AsyncIterator[bytes]: ...  # raises UpstreamError (stalled, stream_broken)

    async def read(self) -> bytes: ...

    async def aclose(self) -> None: ...


class _HttpxBody:
    """UpstreamBody over an httpx response (the client built with an injected transport)."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers = {k.lower(): v for k, v in response.headers.items()}

    async def iter_raw(self) -> AsyncIterator[bytes]:
        try:
            # aiter_bytes, not aiter_raw: a MockTransport response may come already read
            async for data in self._response.aiter_bytes():
                yield data
        except httpx.ReadTimeout as exc:
            raise UpstreamError(
                "upstream stalled (no data within the idle timeout)", code=UpstreamErrorCode.STALLED
            ) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(
                f"upstream stream broke: {type(exc).__name__}", code=UpstreamErrorCode.STREAM_BROKEN
            ) from exc

    async def read(self) -> bytes:
        return b"".join([data async for data in self.iter_raw()])

    async def aclose(self) -> None:
        await self._response.aclose()


@dataclass
class UpstreamStream:
    """An open upstream stream: its parsed JSON chunks."""

    response: UpstreamBody

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """Parsed `data:` payloads until `[DONE]`. Malformed JSON, or a chunk whose choices, deltas or
        usage have the wrong types, is an UpstreamError."""
        async for batch in self.batches():
            for chunk in batch:
                yield chunk

    async def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The chunks of `chunks()`, a list per read of the socket: a reader that takes them this way
        resumes once per read rather than once per token. The same chunks in the same order, the error
        included: the chunks before a malformed one are handed over before it raises."""
        async for events in self._events():
            batch, done, error = _parse_events(events)
            if batch:
                yield batch
            if error is not None:
                raise error
            if done:
                return
        # A stream that ends without [DONE] was cut off (vLLM died or a proxy closed it).
        raise UpstreamError("upstream stream ended without [DONE]", code=UpstreamErrorCode.STREAM_TRUNCATED)

    async def _events(self) -> AsyncIterator[list[bytes]]:
        """The SSE events of each read of the socket, then those the decoder completes at the end."""
        decoder = SSEBytesDecoder()
        async for data in self.response.iter_raw():
            yield decoder.feed(data)
        yield decoder.flush()


def _parse_events(events: list[bytes]) -> tuple[list[dict[str, Any]], bool, UpstreamError | None]:
    """The events parsed up to `[DONE]` or the first bad one: (chunks, whether [DONE] came, the error)."""
    chunks = []
    for event in events:
        if event[:1] != b"{" and event.strip() == b"[DONE]":
            return chunks, True, None
        try:
            chunks.append(_parse_chunk(event))
        except UpstreamError as exc:
            return chunks, False, exc
    return chunks, False, None


def _parse_chunk(data: bytes | str) -> dict[str, Any]:
    if isinstance(data, bytes):  # decoded here: json.loads would first sniff the encoding of bytes
        try:
            data = data.decode()
        except UnicodeDecodeError:  # not UTF-8: read it as a text decoder would, with replacements
            data = data.decode("utf-8", "replace")
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as exc:
        raise UpstreamError("upstream sent malformed JSON in its stream", code=UpstreamErrorCode.MALFORMED) from exc
    if not isinstance(chunk, dict):
        raise UpstreamError("upstream sent a non-object chunk", code=UpstreamErrorCode.MALFORMED)
    if "error" in chunk and "choices" not in chunk:
        err = chunk["error"]
        message = err.get("message") if isinstance(err, dict) else str(err)
        raise UpstreamError(f"upstream error during stream: {message}", code=UpstreamErrorCode.STREAM_ERROR)
    if not _well_shaped(chunk):
        raise UpstreamError("upstream sent a chunk of the wrong shape", code=UpstreamErrorCode.MALFORMED)
    return chunk


def _well_shaped(chunk: dict[str, Any]) -> bool:
    """The parts the proxy reads have the types it expects (the rest is passed on as it is). Plain
    loops: this runs once per streamed token."""
    choices = chunk.get("choices")
    if choices is not None:
        if not isinstance(choices, list):
            return False
        for choice in choices:
            if not isinstance(choice, dict):
                return False
            delta = choice.get("delta")
            if delta is not None and not isinstance(delta, dict):
                return False
    usage = chunk.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            return False
        for n in (usage.get("prompt_tokens"), usage.get("completion_tokens")):
            if n is not None and (not isinstance(n, int) or isinstance(n, bool)):
                return False
    return True


class VLLMClient:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 600.0,
        stream_idle_timeout_s: float | None = None,
        max_connections: int = 512,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Non-stream calls (regeneration, self-checks, listing) get a whole-request read timeout;
        # streams override it with read=None below.
        self._timeout = httpx.Timeout(request_timeout_s, connect=connect_timeout_s)
        self._stream_timeout = httpx.Timeout(
            None, connect=connect_timeout_s, read=stream_idle_timeout_s, write=request_timeout_s, pool=None
        )
        self._request_timeout_s = request_timeout_s
        self._stream_idle_timeout_s = stream_idle_timeout_s
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=self._timeout,
            # Keep-alive as large as the pool: every proxied request holds one upstream connection, and
            # requests queued behind a full pool stall the event loop in httpcore's pool scan (seen
            # with 1,000 streams against a 512 pool: benchmarks/performance/overhead.py). The app sizes the pool
            # from its own concurrency limit, so nothing queues here.
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
        )
        # Headers each chat call adds, asked for at the call (the server's tracing: W3C traceparent).
        self.request_headers: Callable[[], dict[str, str]] | None = None
        # The chat completions' client; none when a test injects a transport (then httpx serves all).
        self._pool = None
        if transport is None:
            self._pool = UpstreamPool(
                base_url, api_key=api_key, connect_timeout_s=connect_timeout_s, max_connections=max_connections
            )

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        await self._client.aclose()

    async def open_chat(self, content: bytes, *, stream: bool, path: str = CHAT_PATH) -> UpstreamBody:
        """POST /v1/chat/completions (or `path`: /v1/completions) with these body bytes; returns once the
        status and headers arrived, whatever the status. The caller reads the body and must `aclose()` it.
        A stream waits at most the idle timeout for each read (the headers included), a non-stream the
        request timeout."""
        read_timeout = self._stream_idle_timeout_s if stream else self._request_timeout_s
        extra = self._call_headers()
        if self._pool is not None:
            return await self._pool.request("POST", path, content=content, read_timeout_s=read_timeout, headers=extra)
        request = self._client.build_request(
            "POST",
            path,
            content=content,
            headers={"content-type": "application/json", **(extra or {})},
            timeout=self._stream_timeout if stream else self._timeout,
        )
        return _HttpxBody(await self._send_stream(request))

    def _call_headers(self) -> dict[str, str] | None:
        """The headers a chat call adds: the hook's (tracing), and the request's routing key."""
        extra = self.request_headers() if self.request_headers is not None else None
        key = ROUTING_KEY.get()
        if key is None:
            return extra
        return {**extra, key[0]: key[1]} if extra else {key[0]: key[1]}

    @asynccontextmanager
    async def stream_chat(self, body: dict[str, Any], *, path: str = CHAT_PATH) -> AsyncIterator[UpstreamStream]:
        """POST /v1/chat/completions (or `path`) with stream=true; raises UpstreamStatusError on an HTTP
        error."""
        response = await self.open_chat(json.dumps(body).encode(), stream=True, path=path)
        try:
            if response.status >= 400:
                raise _status_error(response.status, await response.read())
            yield UpstreamStream(response)
        finally:
            await response.aclose()

    async def _send_stream(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._client.send(request, stream=True)
        except httpx.ReadTimeout as exc:  # connected, but no response headers within the idle timeout
            raise UpstreamError("upstream stalled before its first byte", code=UpstreamErrorCode.STALLED) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"cannot reach upstream: {type(exc).__name__}", code=UpstreamErrorCode.CONNECT) from exc

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Non-streamed chat completion as parsed JSON."""
        extra = self._call_headers()
        response = await self._send("POST", CHAT_PATH, json=body, headers=extra)
        try:
            data = response.json()
        except ValueError as exc:
            raise UpstreamError("upstream returned malformed JSON", code=UpstreamErrorCode.MALFORMED) from exc
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamError("upstream returned an unexpected body", code=UpstreamErrorCode.MALFORMED)
        return data

    async def raw(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A plain request whose response (any status) is handed back untouched."""
        try:
            return await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"cannot reach upstream: {type(exc).__name__}", code=UpstreamErrorCode.CONNECT) from exc

    async def models(self) -> dict[str, Any]:
        response = await self._send("GET", "/v1/models")
        return response.json()

    async def ready(self) -> bool:
        try:
            response = await self._client.get("/health", timeout=httpx.Timeout(5.0))
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self.raw(method, path, **kwargs)
        if response.status_code >= 400:
            raise _status_error(response.status_code, response.content)
        return response


def _status_error(status: int, content: bytes) -> UpstreamStatusError:
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    message = None
    if isinstance(body, dict):
        err = body.get("error", body)
        message = err.get("message") if isinstance(err, dict) else None
    message = message or content.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    return UpstreamStatusError(f"upstream: {message}", status_code=status, body=body)


def assistant_text_of(completion: dict[str, Any]) -> str:
    """The assistant's text of a non-streamed completion (reasoning and content, in order)."""
    return _choice_text(completion["choices"][0])


def choice_texts(completion: dict[str, Any]) -> list[str]:
    """The assistant's text of every choice of a non-streamed completion (`n` > 1), in index order."""
    return [_choice_text(c) for c in sorted(completion.get("choices") or [], key=lambda c: c.get("index", 0))]


def _choice_text(choice: dict[str, Any]) -> str:
    message = choice.get("message") or {}
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    content = message.get("content") or ""
    return f"{reasoning}{content}" if not reasoning else f"{reasoning}\n{content}"
