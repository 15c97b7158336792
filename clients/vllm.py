"""The generator client: vLLM's OpenAI-compatible API over one pooled httpx.AsyncClient.

Streams have no whole-request timeout (a long reasoning chain may stream for many minutes); their read
timeout is an idle limit, the longest silence between two reads (`stream_idle_timeout_s`; None: none),
so a stalled vLLM is noticed while a healthy long stream never is. A stall is an UpstreamError with
code "stalled". Connect and write timeouts are explicit. Closing a stream closes the HTTP connection,
which makes vLLM abort the generation.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from faithproxy.clients.sse import SSEDecoder
from faithproxy.faithcore.errors import UpstreamError, UpstreamErrorCode, UpstreamStatusError


@dataclass
class UpstreamStream:
    """An open upstream stream: the raw response (for byte pass-through) and a JSON chunk iterator."""

    response: httpx.Response

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """Parsed `data:` payloads until `[DONE]`. Malformed JSON, or a chunk whose choices, deltas or
        usage have the wrong types, is an UpstreamError."""
        decoder = SSEDecoder()
        try:
            async for text in self.response.aiter_text():
                for data in decoder.feed(text):
                    if data.strip() == "[DONE]":
                        return
                    yield _parse_chunk(data)
            for data in decoder.flush():
                if data.strip() == "[DONE]":
                    return
                yield _parse_chunk(data)
        except httpx.ReadTimeout as exc:
            raise UpstreamError(
                "upstream stream stalled (no data within the idle timeout)", code=UpstreamErrorCode.STALLED
            ) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(
                f"upstream stream broke: {type(exc).__name__}", code=UpstreamErrorCode.STREAM_BROKEN
            ) from exc
        # A stream that ends without [DONE] was cut off (vLLM died or a proxy closed it).
        raise UpstreamError("upstream stream ended without [DONE]", code=UpstreamErrorCode.STREAM_TRUNCATED)


def _parse_chunk(data: str) -> dict[str, Any]:
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
    """The parts the proxy reads have the types it expects (the rest is passed on as it is)."""
    choices = chunk.get("choices")
    if choices is not None:
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            return False
        if not all(isinstance(c.get("delta"), dict | None) for c in choices):
            return False
    usage = chunk.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            return False
        counts = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
        if not all(isinstance(n, int | None) and not isinstance(n, bool) for n in counts):
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

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    async def aclose(self) -> None:
        await self._client.aclose()

    @asynccontextmanager
    async def stream_chat(self, body: dict[str, Any]) -> AsyncIterator[UpstreamStream]:
        """POST /v1/chat/completions with stream=true; raises UpstreamStatusError on an HTTP error."""
        request = self._client.build_request(
            "POST", "/v1/chat/completions", json=body, timeout=self._stream_timeout
        )
        response = await self._send_stream(request)
        try:
            if response.status_code >= 400:
                await response.aread()
                raise _status_error(response)
            yield UpstreamStream(response)
        finally:
            await response.aclose()

    @asynccontextmanager
    async def stream_raw(self, content: bytes) -> AsyncIterator[httpx.Response]:
        """POST the client's body bytes as they are and hand back the open response, any status
        (pass-through mode: the client gets vLLM's bytes)."""
        request = self._client.build_request(
            "POST",
            "/v1/chat/completions",
            content=content,
            headers={"content-type": "application/json"},
            timeout=self._stream_timeout,
        )
        response = await self._send_stream(request)
        try:
            yield response
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
        response = await self._send("POST", "/v1/chat/completions", json=body)
        try:
            data = response.json()
        except ValueError as exc:
            raise UpstreamError("upstream returned malformed JSON", code=UpstreamErrorCode.MALFORMED) from exc
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamError("upstream returned an unexpected body", code=UpstreamErrorCode.MALFORMED)
        return data

    async def raw(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A plain request whose response (any status) is handed back untouched (pass-through mode)."""
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
            raise _status_error(response)
        return response


def _status_error(response: httpx.Response) -> UpstreamStatusError:
    try:
        body = response.json()
    except ValueError:
        body = None
    message = None
    if isinstance(body, dict):
        err = body.get("error", body)
        message = err.get("message") if isinstance(err, dict) else None
    message = message or response.text[:500] or f"HTTP {response.status_code}"
    return UpstreamStatusError(f"upstream: {message}", status_code=response.status_code, body=body)


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
