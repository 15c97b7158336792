"""One route per door of the table: read the body, admit it (server/admission/admit.py), hand it to
`DoorServing` (server/doors/serving.py), answer a refusal in the door's format. Thin on purpose: the loop
lives in server/chain/session.py, the response shapes in the doors' renderers. Off mode's pure-ASGI fast
path (server/doors/off.py) serves most `off` requests before they reach these routes, with the same
admission and the same `Passthrough` the serving object uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.admission.admit import admit, arrival, count_refused
from faithproxy.server.doors.schema import request_body
from faithproxy.server.protocol.doors import Door, DoorTable
from faithproxy.server.protocol.errors import error_response
from faithproxy.server.state import StateDep


def door_endpoint(door: Door) -> Callable[[Request, StateDep], Awaitable[Response]]:
    async def endpoint(request: Request, state: StateDep) -> Response:
        started = arrival()
        try:
            raw = await request.body()  # PayloadTooLarge from the size limit while reading
            admitted = await admit(raw, request.headers, state, door, started=started)
            # Loaded on first use, not with this module: it brings the chain and the correction machine,
            # which a server that only passes requests through never needs.
            from faithproxy.server.doors.serving import DoorServing

            return await DoorServing(state, admitted).respond()
        except FaithproxyError as exc:  # refused before a mode took the request (the serving counts the rest)
            count_refused(state.metrics, exc, door.path)
            return error_response(exc, door=door)

    endpoint.__name__ = door.name  # the OpenAPI operation's id
    return endpoint


def door_routes(doors: DoorTable) -> APIRouter:
    router = APIRouter()
    for door in doors:
        router.add_api_route(
            door.path,
            door_endpoint(door),
            methods=["POST"],
            response_model=None,
            openapi_extra=request_body(door),
            responses=door.openapi_responses,
        )
    return router
