"""Request limits: header and body size, images, max_tokens, concurrency.

    limit                       where                               answer
    headers (all, in bytes)     RequestSizeMiddleware (ASGI)        431
    body (bytes)                RequestSizeMiddleware (ASGI)        413, from Content-Length before
                                                                    reading, else while reading
    concurrent chat requests    ConcurrencyLimitMiddleware (ASGI)   429 + Retry-After
    in flight per client        ConcurrencyLimitMiddleware (ASGI)   429 too_many_client_requests
      (API key, else address)
    images per request          check_body (admission)              400 too_many_images
    one data-URL image (bytes)  check_body (admission)              413 image_too_large
    max_tokens above the cap    check_body (admission)              400 max_tokens_too_large
      (or MAX_TOKEN_COUNT)
    JSON nesting, huge integers server/admission/json_guard.py (admission)    400 nesting_too_deep, number_too_large

The middleware is pure ASGI (starlette's BaseHTTPMiddleware would buffer streams and break
contextvars). check_body runs in server/admission/admit.py, the one admission path of every door and mode.
A request takes its concurrency slot once its whole body has arrived (a slow upload holds none;
server/admission/connections.py bounds how long it may take), and a stream holds the slot until its last byte
is sent, because the inner app returns only then, or until its client leaves, which cancels the request
(server/admission/client_gone.py). Images fetched for judges have their own size and time limits
(clients/image_fetch.py).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from faithproxy.faithcore.errors import FaithproxyError, HeadersTooLarge, Overloaded, PayloadTooLarge, PolicyError
from faithproxy.server.admission.client_gone import serve_while_connected
from faithproxy.server.admission.media_parts import media_parts
from faithproxy.server.admission.refusals import count_refusal
from faithproxy.server.protocol.errors import send_error
from faithproxy.server.settings import Settings

MAX_TOKEN_COUNT = 2**31 - 1  # no model generates more: a larger max_tokens is a 400 even with no cap


class RequestSizeMiddleware:
    """431 for oversized headers, 413 for an oversized body (declared or streamed)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        if sum(len(name) + len(value) for name, value in headers) > self.max_header_bytes:
            error = HeadersTooLarge(f"Request headers exceed {self.max_header_bytes} bytes.", code="headers_too_large")
            count_refusal(scope, error)
            await send_error(scope, receive, send, error)
            return
        declared = next((value for name, value in headers if name == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            error = self._too_large()
            count_refusal(scope, error)
            await send_error(scope, receive, send, error)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise self._too_large()  # the app's exception handler answers 413
            return message

        await self.app(scope, limited_receive, send)

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"Request body exceeds {self.max_body_bytes} bytes.", code="body_too_large")


class ConcurrencyLimitMiddleware:
    """At most `limit` requests on `paths` at once, and at most `per_client` of one client (client_key);
    the next gets 429 with Retry-After at once (no queue: the client, or its load balancer, decides
    whether to wait or go elsewhere)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        retry_after_s: int,
        per_client: int | None = None,
        paths: Iterable[str],  # the doors' (server/protocol/doors.py)
    ) -> None:
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.paths = frozenset(paths)
        self.active = 0
        self.per_client = per_client
        self.by_client: Counter[str] = Counter()  # requests in flight per client_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        # Admission starts when the body has arrived: a slow upload holds no slot (its time is bounded
        # by the client body timeout, server/admission/connections.py).
        try:
            body = await read_body(receive)
        except FaithproxyError as exc:  # 413 while reading
            count_refusal(scope, exc)
            await send_error(scope, receive, send, exc)
            return
        if body is None:
            return  # the client left (or timed out) before its body was in: no one to answer
        client = client_key(scope) if self.per_client is not None else None
        error = self._refusal(client)
        if error is not None:
            headers = {"retry-after": str(self.retry_after_s)}
            count_refusal(scope, error)
            await send_error(scope, replay(body, receive), send, error, headers=headers)
            return
        self.active += 1
        if client is not None:
            self.by_client[client] += 1
        try:
            # a client that leaves before its answer is complete cancels the work (server/admission/client_gone.py)
            await serve_while_connected(self.app, scope, body, receive, send)
        finally:
            self.active -= 1
            if client is not None:
                self.by_client[client] -= 1
                if not self.by_client[client]:
                    del self.by_client[client]  # the table holds only clients with requests in flight

    def _refusal(self, client: str | None) -> Overloaded | None:
        retry = self.retry_after_s
        if self.active >= self.limit:
            message = f"Too many concurrent requests (limit {self.limit}); retry after {retry} s."
            return Overloaded(message, retry_after_s=retry)
        if client is not None and self.per_client is not None and self.by_client[client] >= self.per_client:
            message = f"Too many requests in flight from this client (limit {self.per_client}); retry after {retry} s."
            return Overloaded(message, retry_after_s=retry, code="too_many_client_requests")
        return None


def client_key(scope: Scope) -> str:
    """Whom a request counts against: its API key (a digest: the key is never kept), else its address."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return "key:" + hashlib.sha256(value).hexdigest()[:16]
    client = scope.get("client")
    return f"addr:{client[0]}" if client else "addr:-"


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client disconnected first."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives `body` as one message, then what the client sends (its disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


def check_body(body: dict[str, Any], settings: Settings) -> bool:
    """Raises for a body over the image or token limits; True when it added the max_tokens cap
    (the caller re-encodes the body it forwards). Images are counted, not decoded."""
    images = 0
    for media in media_parts(body):  # every door's shape: chat parts, Responses input_image, Anthropic image blocks
        if media.media != "image":
            continue
        images += 1
        if images > settings.max_images_per_request:
            raise PolicyError(
                f"Too many images: at most {settings.max_images_per_request} per request.",
                param="messages",
                code="too_many_images",
            )
        if media.size > settings.max_image_bytes:
            message = f"Image {images} ({media.where}) exceeds {settings.max_image_bytes} bytes."
            raise PayloadTooLarge(message, param="messages", code="image_too_large")
    cap = settings.max_tokens_cap
    asked = False
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):  # the last: /v1/responses
        value = body.get(name)
        if value is None:
            continue
        asked = True
        if isinstance(value, float) and value.is_integer():
            value = body[name] = int(value)  # 256.0 is an integer in JSON Schema, and to vLLM
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PolicyError(f"'{name}' must be a positive integer.", param=name)
        limit = MAX_TOKEN_COUNT if cap is None else cap
        if value > limit:
            shown = value if value < 10**20 else f"{value:.3e}"  # 1e308 as a float is an int of 309 digits
            raise PolicyError(
                f"'{name}' is {shown}, above this server's limit of {limit}.", param=name, code="max_tokens_too_large"
            )
    if cap is not None and not asked:
        body["max_output_tokens" if "input" in body and "messages" not in body else "max_tokens"] = cap
        return True
    return False
