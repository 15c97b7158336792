"""GET /v1/faithfulness/{request_id}: the per-step report of a finished, verified request.

Behind the same API keys as the chat endpoint (the auth middleware guards every path but the
probes). The id is the response's `X-Faithproxy-Request-Id` header; reports are kept for a bounded
time and number (server/observe/reports.py), after which, like for an id never seen, the answer is a 404 in
OpenAI's error format. A shared store that cannot be reached (Redis down) is a 503: the report may exist.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.protocol.errors import ErrorResponse, error_response
from faithproxy.server.state import StateDep

router = APIRouter()


class ReportNotFound(FaithproxyError):
    status_code = 404
    error_type = "invalid_request_error"


REPORT_EXAMPLE = {
    "id": "3f9c0d6e8a1b2c4d5e6f7a8b",
    "object": "faithfulness.report",
    "created": 1_760_000_000,
    "model": "qwen2.5-vl",
    "stream": True,
    "judge": "claude",
    "outcome": "completed",
    "error": None,
    "faithfulness": {
        "mode": "correct",
        "detector": "judge",
        "steps": [
            {
                "index": 0,
                "kind": "perception",
                "verdict": "faithful",
                "detected": "unfaithful",
                "attempts": 1,
                "regenerated": True,
                "residual": False,
                "original_text": "The circle is blue. ",
                "text": "The circle is red. ",
                "channel": "content",
            },
        ],
        "perception_steps": 1,
        "unfaithful_detected": 1,
        "residual": 0,
        "upr_detected": 1.0,
        "upr_residual": 0.0,
        "regenerations": 1,
        "fixed": 1,
        "rounds": 2,
        "verification_s": 0.41,
    },
}


@router.get(
    "/v1/faithfulness/{request_id}",
    response_model=None,
    responses={
        200: {"description": "The report", "content": {"application/json": {"example": REPORT_EXAMPLE}}},
        404: {"model": ErrorResponse, "description": "Unknown id, expired report, or a request in mode off"},
        503: {"model": ErrorResponse, "description": "The shared report store (Redis) cannot be reached"},
    },
)
async def faithfulness_report(request_id: str, state: StateDep) -> Response:
    encoded = await state.reports.fetch(request_id) if state.reports is not None else None
    if encoded is None:
        return error_response(
            ReportNotFound(
                f"No faithfulness report for request '{request_id[:64]}': unknown, expired (reports are kept "
                f"{state.settings.reports_max_age_s:g} s, the last {state.settings.reports_max_count}), "
                "or a request in mode off, which verifies nothing.",
                param="request_id",
                code="report_not_found",
            )
        )
    return Response(encoded, media_type="application/json")
