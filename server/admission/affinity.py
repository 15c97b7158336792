"""One routing key per request, on every upstream call it makes (docs/replicas.md).

A verified request calls vLLM several times: the first round, the rewrites (with `n` samples), the
continuations after them, self-checks that ask the generator. Each call re-sends the image and the chain
accepted so far, and only the replica that served the first call holds that prefix in its cache. Behind
a consistent-hash router (vLLM's router reads `x-session-id`) one key on all of them keeps the request on
that replica.

`RoutingKeyMiddleware` (pure ASGI, in front of everything that may call vLLM) takes the key from the
client's own header of that name when it sent one (a conversation's id keeps its turns together too),
else makes one for the request, and sets it for the request's context: the vLLM client adds it to every
call it makes in that context (clients/vllm.py: ROUTING_KEY), the tasks the request starts included
(asyncio copies the context into them). Off mode's pass-through sends it too.
"""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Receive, Scope, Send

from faithproxy.clients.vllm import ROUTING_KEY


class RoutingKeyMiddleware:
    def __init__(self, app: ASGIApp, *, header: str) -> None:
        self.app = app
        self.header = header.strip().lower()
        self._raw_name = self.header.encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.header:
            await self.app(scope, receive, send)
            return
        value = next((v for k, v in scope["headers"] if k == self._raw_name and v.strip()), None)
        key = value.decode("latin-1").strip() if value is not None else uuid.uuid4().hex
        token = ROUTING_KEY.set((self.header, key))
        try:
            await self.app(scope, receive, send)
        finally:
            ROUTING_KEY.reset(token)
