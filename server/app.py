"""The FastAPI application: built by `create_app(settings)`; resources live in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from clients.judges import build_judge
from clients.vllm import VLLMClient
from detectors.registry import DetectorDeps, build_detectors
from faithcore.errors import FaithproxyError, UpstreamError
from regenerators.registry import build_regenerator
from server.errors import faithproxy_error_handler, validation_error_handler
from server.metrics import Metrics
from server.routers import chat, ops
from server.settings import Settings, get_settings
from server.state import AppState
from server.traces import TraceWriter

log = logging.getLogger("faithproxy")


def create_app(
    settings: Settings | None = None,
    *,
    registry: CollectorRegistry | None = None,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """Each app owns its metrics registry (so several apps can live in one test process).

    `upstream_transport` replaces the network under the vLLM client: fault-injection tests only.
    """
    settings = settings or get_settings()
    if registry is None:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
        generator = VLLMClient(
            settings.upstream_url,
            api_key=key,
            connect_timeout_s=settings.upstream_connect_timeout_s,
            request_timeout_s=settings.upstream_request_timeout_s,
            transport=upstream_transport,
        )
        judges = {cfg.name: build_judge(cfg) for cfg in settings.judges}
        detectors = build_detectors(DetectorDeps(judges=judges, default_judge=settings.default_judge))
        metrics = Metrics(registry, detectors)
        state = AppState(
            settings=settings,
            generator=generator,
            detectors=detectors,
            judges=list(judges),
            regenerator=build_regenerator(
                settings.regenerator,
                generator,
                temperature=settings.regeneration_temperature,
                max_tokens=settings.regeneration_max_tokens,
            ),
            metrics=metrics,
            tracer=TraceWriter(settings.trace_path),
        )
        app.state.faithproxy = state
        try:
            listing = await generator.models()
            state.learn_models([m["id"] for m in listing.get("data", []) if isinstance(m, dict) and "id" in m])
        except (UpstreamError, ValueError):
            log.warning("upstream %s not reachable at start; /readyz will say so", settings.upstream_url)
        try:
            yield
        finally:
            for detector in detectors.values():
                await detector.aclose()  # the judge detector closes the judge backends it owns
            await generator.aclose()

    app = FastAPI(title="faithproxy", version="0.1.0", lifespan=lifespan)
    app.add_exception_handler(FaithproxyError, faithproxy_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.include_router(chat.router)
    app.include_router(ops.router)
    return app
