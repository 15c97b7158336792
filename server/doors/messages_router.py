"""POST /v1/messages (Anthropic's Messages API): admit the request, hand it to the serving object
(server/doors/messages.py); every refusal in Anthropic's error format. `off` is mostly served by off
mode's pure-ASGI path (server/doors/off.py), in the same format.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.admission.admit import admit, arrival, count_refused
from faithproxy.server.admission.limits import MESSAGES_PATH
from faithproxy.server.doors.bodies import parse_messages_body
from faithproxy.server.doors.schema import MESSAGES_OPENAPI_EXTRA, MESSAGES_RESPONSES
from faithproxy.server.protocol.errors import error_response
from faithproxy.server.state import StateDep

router = APIRouter()


@router.post("/v1/messages", response_model=None, openapi_extra=MESSAGES_OPENAPI_EXTRA, responses=MESSAGES_RESPONSES)
async def messages(request: Request, state: StateDep) -> Response:
    from faithproxy.server.doors.messages import MessagesServing

    started = arrival()
    try:
        raw = await request.body()  # PayloadTooLarge from the size limit while reading
        admitted = await admit(
            raw, request.headers, state, parse_messages_body, started=started, endpoint=MESSAGES_PATH
        )
        return await MessagesServing(state, admitted).respond()
    except FaithproxyError as exc:  # refused before a mode took the request (the serving counts the rest)
        count_refused(state.metrics, exc, MESSAGES_PATH)
        return error_response(exc, path=MESSAGES_PATH)  # in Anthropic's format
