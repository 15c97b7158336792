"""POST /v1/chat/completions: admit the request, hand it to the serving object.

Thin on purpose: admission (body, limits, policy, media URLs) is server/admission/admit.py's, shared with
off mode's pure-ASGI path; the loop lives in server/chain/session.py, the response shapes in
server/doors/serving.py.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.admission.admit import admit, arrival, count_refused, parse_chat_body
from faithproxy.server.admission.limits import CHAT_PATH
from faithproxy.server.doors.schema import CHAT_OPENAPI_EXTRA, CHAT_RESPONSES
from faithproxy.server.protocol.errors import error_response
from faithproxy.server.state import StateDep

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None, openapi_extra=CHAT_OPENAPI_EXTRA, responses=CHAT_RESPONSES)
async def chat_completions(request: Request, state: StateDep) -> Response:
    started = arrival()
    try:
        raw = await request.body()  # PayloadTooLarge from the size limit while reading
        admitted = await admit(raw, request.headers, state, parse_chat_body, started=started, endpoint=CHAT_PATH)
        from faithproxy.server.doors.serving import ChatServing  # loaded on first use: off mode never needs it

        return await ChatServing(state, admitted).respond()
    except FaithproxyError as exc:  # refused before a mode took the request (ChatServing counts the rest)
        count_refused(state.metrics, exc, CHAT_PATH)
        return error_response(exc)
