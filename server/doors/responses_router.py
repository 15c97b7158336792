"""POST /v1/responses (OpenAI's Responses API): admit the request, hand it to the serving object
(server/doors/responses.py). As thin as the chat door; `off` is mostly served before this router by
server/doors/off.py.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.admission.admit import admit, arrival, count_refused
from faithproxy.server.admission.limits import RESPONSES_PATH
from faithproxy.server.doors.bodies import parse_responses_body
from faithproxy.server.doors.schema import RESPONSES_OPENAPI_EXTRA, RESPONSES_RESPONSES
from faithproxy.server.protocol.errors import error_response
from faithproxy.server.state import StateDep

router = APIRouter()


@router.post("/v1/responses", response_model=None, openapi_extra=RESPONSES_OPENAPI_EXTRA, responses=RESPONSES_RESPONSES)
async def responses(request: Request, state: StateDep) -> Response:
    started = arrival()
    try:
        raw = await request.body()  # PayloadTooLarge from the size limit while reading
        admitted = await admit(
            raw, request.headers, state, parse_responses_body, started=started, endpoint=RESPONSES_PATH
        )
        from faithproxy.server.doors.responses import ResponsesServing  # loaded on first use, as chat's

        return await ResponsesServing(state, admitted).respond()
    except FaithproxyError as exc:  # refused before a mode took the request (the serving counts the rest)
        count_refused(state.metrics, exc, RESPONSES_PATH)
        return error_response(exc)
