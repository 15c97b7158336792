"""POST /v1/completions: admit the request, hand it to the serving object (server/doors/completions.py).

As thin as the chat door: admission is server/admission/admit.py's with the completions body parser
(server/doors/bodies.py); `off` mode is mostly served before this router by server/doors/off.py.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.admission.admit import admit, arrival, count_refused
from faithproxy.server.admission.limits import COMPLETIONS_PATH
from faithproxy.server.doors.bodies import parse_completions_body
from faithproxy.server.doors.schema import COMPLETIONS_OPENAPI_EXTRA, COMPLETIONS_RESPONSES
from faithproxy.server.protocol.errors import error_response
from faithproxy.server.state import StateDep

router = APIRouter()


@router.post(
    "/v1/completions", response_model=None, openapi_extra=COMPLETIONS_OPENAPI_EXTRA, responses=COMPLETIONS_RESPONSES
)
async def completions(request: Request, state: StateDep) -> Response:
    started = arrival()
    try:
        raw = await request.body()  # PayloadTooLarge from the size limit while reading
        admitted = await admit(
            raw, request.headers, state, parse_completions_body, started=started, endpoint=COMPLETIONS_PATH
        )
        from faithproxy.server.doors.completions import CompletionServing  # loaded on first use, as chat's

        return await CompletionServing(state, admitted).respond()
    except FaithproxyError as exc:  # refused before a mode took the request (the serving counts the rest)
        count_refused(state.metrics, exc, COMPLETIONS_PATH)
        return error_response(exc)
