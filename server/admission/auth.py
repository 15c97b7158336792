"""Bearer-key authentication of the proxy's clients: pure ASGI middleware.

Enabled when `FAITHPROXY_API_KEYS` lists at least one key or the policy file
(`FAITHPROXY_POLICY_FILE`, server/admission/key_policy.py) names keys: a request must carry
`Authorization: Bearer <key>` with one of them; otherwise 401 in OpenAI's error format (type
`invalid_request_error`, code `invalid_api_key`) and a `WWW-Authenticate: Bearer` header.

Open without a key: `/healthz` and `/readyz` (probes), and `/metrics` unless `metrics_require_key`
(Prometheus scrapers often carry no credentials; the metrics hold no request text).

Comparison is constant-time: the presented key and every configured key are hashed to SHA-256 and the
digests compared with `hmac.compare_digest`, all of them, so neither the matching key's position nor
its length shows in the timing. The client's key stays here: the upstream and judge clients send their
own keys, never a client header, and no key is logged or traced.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from faithproxy.faithcore.errors import AuthError
from faithproxy.server.admission.refusals import count_refusal
from faithproxy.server.protocol.doors import Api
from faithproxy.server.protocol.errors import door_at, send_error

ALWAYS_OPEN = frozenset({"/healthz", "/readyz"})


class KeySource(Protocol):
    """More valid keys, which may change while serving: the policy file's (server/admission/key_policy.py)."""

    def valid(self, token: bytes) -> bool: ...

    def has_keys(self) -> bool: ...


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class APIKeyMiddleware:
    """401 for requests outside `open_paths` without one of `keys` as a bearer token."""

    def __init__(
        self,
        app: ASGIApp,
        keys: Iterable[str],
        *,
        open_paths: Iterable[str] = ALWAYS_OPEN,
        more_keys: KeySource | None = None,
    ) -> None:
        self.app = app
        self._digests = [_digest(key.encode()) for key in keys]
        if not self._digests and more_keys is None:
            raise ValueError("APIKeyMiddleware needs at least one key")
        self.open_paths = frozenset(open_paths)
        self.more_keys = more_keys

    def _open(self) -> bool:
        """No key anywhere (a policy file without keys, and no FAITHPROXY_API_KEYS): nothing to check."""
        return not self._digests and self.more_keys is not None and not self.more_keys.has_keys()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or self._open():
            await self.app(scope, receive, send)
            return
        token = _bearer_token(scope)
        if token is None:
            error = AuthError("Missing API key: send it as 'Authorization: Bearer <key>'.", code="invalid_api_key")
        elif not self.valid(token):
            error = AuthError("Incorrect API key provided.", code="invalid_api_key")
        else:
            await self.app(scope, receive, send)
            return
        count_refusal(scope, error)
        await send_error(scope, receive, send, error, headers={"www-authenticate": "Bearer"})

    def valid(self, token: bytes) -> bool:
        presented = _digest(token)
        ok = False
        for digest in self._digests:
            ok |= hmac.compare_digest(presented, digest)
        if self.more_keys is not None:
            ok |= self.more_keys.valid(token)
        return ok


def _bearer_token(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


class AnthropicKeyHeader:
    """The anthropic SDK sends its key as `x-api-key`, not as a bearer token. On a door of Anthropic's
    API a request with `x-api-key` and no `Authorization` gets `Authorization: Bearer <key>` added to its
    scope, so the key check above, the key policy (server/admission/key_policy.py) and the per-client
    limits all read one header.
    Sits outside APIKeyMiddleware."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door = door_at(scope) if scope["type"] == "http" else None
        if door is not None and door.api is Api.ANTHROPIC:
            headers = scope["headers"]
            key = next((value for name, value in headers if name == b"x-api-key"), None)
            if key is not None and not any(name == b"authorization" for name, _ in headers):
                scope = {**scope, "headers": [*headers, (b"authorization", b"Bearer " + key.strip())]}
        await self.app(scope, receive, send)
