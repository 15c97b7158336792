"""Operational endpoints: liveness, readiness, metrics, and the upstream's model list."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from faithproxy.faithcore.errors import UpstreamError
from faithproxy.server.observe.metrics import upstream_error_label
from faithproxy.server.protocol.errors import error_response
from faithproxy.server.runtime.workers import scrape_registry
from faithproxy.server.state import StateDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive (says nothing about vLLM)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: StateDep) -> JSONResponse:
    """Ready when vLLM answers its health check."""
    if await state.generator.ready():
        return JSONResponse({"status": "ready", "upstream": state.generator.base_url})
    return JSONResponse({"status": "unavailable", "upstream": state.generator.base_url}, status_code=503)


@router.get("/metrics")
async def metrics(state: StateDep) -> Response:
    # Under `serve --workers N`, every worker's samples (server/runtime/workers.py).
    return Response(generate_latest(scrape_registry(state.metrics.registry)), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", response_model=None)
async def models(state: StateDep) -> Response:
    try:
        listing = await state.generator.models()
    except UpstreamError as exc:
        state.metrics.upstream_errors.labels(upstream_error_label(exc)).inc()
        return error_response(exc)
    state.learn_models([m["id"] for m in listing.get("data", []) if isinstance(m, dict) and "id" in m])
    return JSONResponse(listing)
