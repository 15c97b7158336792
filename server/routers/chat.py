"""POST /v1/chat/completions: parse, check limits, pick the policy, hand over to the serving object.

Thin on purpose: the loop lives in server/session.py, the response shapes in server/responses.py.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import Response

from faithproxy.faithcore.errors import FaithproxyError, PolicyError
from faithproxy.server.errors import error_response
from faithproxy.server.image_urls import settle_media_urls
from faithproxy.server.limits import check_body
from faithproxy.server.passthrough import parse_body
from faithproxy.server.policy import policy_from_headers
from faithproxy.server.schema import CHAT_OPENAPI_EXTRA, CHAT_RESPONSES
from faithproxy.server.state import StateDep

router = APIRouter()


_parse_body = parse_body  # the same checks as off mode's pure-ASGI path


@router.post("/v1/chat/completions", response_model=None, openapi_extra=CHAT_OPENAPI_EXTRA, responses=CHAT_RESPONSES)
async def chat_completions(request: Request, state: StateDep) -> Response:
    try:
        raw = await request.body()  # PayloadTooLarge from the size limit while reading
        body = _parse_body(raw)
        changed = check_body(body, state.settings)  # True: the max_tokens cap was added
        policy = policy_from_headers(
            request.headers,
            state.settings,
            detectors=state.detectors,
            judges=state.judges,
            hints_available=state.hint_llm is not None,
        )
        # Every mode: no client-chosen URL reaches vLLM unchecked (ImageRefused: nothing sent yet).
        changed |= await settle_media_urls(body, state.settings.image_urls, state.image_fetcher)
        if changed:
            raw = json.dumps(body).encode()  # off mode forwards these bytes
        from faithproxy.server.responses import ChatServing  # loaded on first use: off mode never needs it

        serving = ChatServing(state, policy, body, raw)
        return await serving.respond()
    except FaithproxyError as exc:
        state.metrics.requests.labels(
            "unknown" if not isinstance(exc, PolicyError) else "rejected", "-", str(exc.status_code // 100) + "xx"
        ).inc()
        return error_response(exc)
