"""The FastAPI application: built by `create_app(settings)`; resources live in the lifespan."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, disable_created_metrics
from starlette.types import Receive, Scope, Send

from faithproxy.clients.call_gate import CallGate
from faithproxy.clients.call_gate import install as install_call_gate
from faithproxy.clients.image_fetch import ImageFetcher
from faithproxy.clients.judges import build_judge
from faithproxy.clients.vllm import VLLMClient
from faithproxy.detectors.base import Detector
from faithproxy.detectors.registry import DetectorDeps, build_detectors
from faithproxy.faithcore.context import Regeneration, RequestView
from faithproxy.faithcore.errors import FaithproxyError, UpstreamError
from faithproxy.faithcore.types import Step
from faithproxy.regenerators.base import Regenerator
from faithproxy.regenerators.registry import REGENERATORS, build_regenerator
from faithproxy.server.admission.affinity import RoutingKeyMiddleware
from faithproxy.server.admission.auth import ALWAYS_OPEN, AnthropicKeyHeader, APIKeyMiddleware
from faithproxy.server.admission.connections import STATE_KEY as CONNECTIONS_STATE
from faithproxy.server.admission.connections import connection_rules
from faithproxy.server.admission.key_policy import KeyPolicies
from faithproxy.server.admission.limits import ConcurrencyLimitMiddleware, RequestSizeMiddleware
from faithproxy.server.doors import ops_router, pages_router, reports_router
from faithproxy.server.doors.off import OffModeMiddleware
from faithproxy.server.doors.routes import door_routes
from faithproxy.server.doors.schema import install_openapi
from faithproxy.server.doors.table import DOORS
from faithproxy.server.observe import otel
from faithproxy.server.observe.metrics import Metrics
from faithproxy.server.observe.report_page import ListedReports
from faithproxy.server.observe.reports import Reports, ReportStore, SharedReportStore
from faithproxy.server.observe.traces import TraceWriter
from faithproxy.server.protocol.doors import DoorTable
from faithproxy.server.protocol.errors import faithproxy_error_handler, validation_error_handler
from faithproxy.server.protocol.sse import BODY_SEND
from faithproxy.server.runtime.heap_trim import HeapTrimmer, fix_mmap_threshold
from faithproxy.server.runtime.internal_errors import InternalErrorMiddleware
from faithproxy.server.runtime.workers import worker_exit
from faithproxy.server.settings import Settings, get_settings
from faithproxy.server.shadow.checker import ShadowChecker
from faithproxy.server.state import AppState

log = logging.getLogger("faithproxy")


def create_app(
    settings: Settings | None = None,
    *,
    registry: CollectorRegistry | None = None,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    image_fetcher: ImageFetcher | None = None,
    doors: DoorTable = DOORS,
) -> FastAPI:
    """The server, put together from its rooms (server/__init__.py): what watches it (outliving a
    lifespan that runs again), the resources its lifespan builds (AppState), the routes, the middleware.
    Each app owns its metrics registry (so several apps can live in one test process).

    `upstream_transport` replaces the network under the vLLM client: fault-injection tests only.
    `image_fetcher` replaces the one built from `settings.image_fetch` (tests inject a resolver).
    `doors` is the door table (server/doors/table.py; a test may add a door of its own).
    """
    settings = settings or get_settings()
    watch = _Watchers(settings, registry)
    app = FaithproxyApp(
        title="faithproxy",
        version="0.1.0",
        lifespan=_lifespan(settings, watch, doors, upstream_transport, image_fetcher),
    )
    _add_routes(app, settings, doors)
    _add_middleware(app, settings, doors, watch)
    return app


class FaithproxyApp(FastAPI):
    """FastAPI, with the server's own `send` on each HTTP request's scope: a stream sends its middle
    frames there, past the layers that watch only its start and its end (server/protocol/sse.py
    `body_send`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[BODY_SEND] = send
        await super().__call__(scope, receive, send)


class _Watchers:
    """What outlives a lifespan that runs again (test clients restart it): the metrics registry and the
    app's one Metrics (made in the first lifespan, when the detectors are known), the reports, the
    policy file's keys (the API-key middleware asks them) and OpenTelemetry (when OTEL_* ask for it)."""

    def __init__(self, settings: Settings, registry: CollectorRegistry | None) -> None:
        # Counters and histograms export no `<name>_created` series (prometheus_client adds one beside
        # each by default): it doubles the series count and no dashboard or alert reads it. A
        # library-wide switch, read when /metrics is rendered, so it holds for metrics made before it.
        disable_created_metrics()
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
        self.registry = registry
        self.built_metrics: list[Metrics] = []  # one, once the first lifespan made it
        # GET /reports lists them (server/observe/report_page.py)
        store = _report_store(settings, self.built_metrics)
        self.reports = ListedReports(store, settings.reports_max_count, settings.reports_max_age_s)
        self.key_policies = _key_policies(settings, self.built_metrics)

        def count_dropped(spans: int) -> None:  # from the export thread
            if self.built_metrics:
                self.built_metrics[0].otel_spans_dropped.inc(spans)

        self.telemetry = otel.from_environment(count_dropped)  # loads OpenTelemetry only when it is on

    def metrics(self, detectors: list[str], judges: list[str], doors: DoorTable) -> Metrics:
        if not self.built_metrics:
            self.built_metrics.append(Metrics(self.registry, detectors, judges=judges, endpoints=doors.paths))
        return self.built_metrics[0]


def _lifespan(
    settings: Settings,
    watch: _Watchers,
    doors: DoorTable,
    upstream_transport: httpx.AsyncBaseTransport | None,
    image_fetcher: ImageFetcher | None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Any]]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
        generator = VLLMClient(
            settings.upstream_url,
            api_key=key,
            connect_timeout_s=settings.upstream_connect_timeout_s,
            request_timeout_s=settings.upstream_request_timeout_s,
            stream_idle_timeout_s=settings.upstream_stream_idle_timeout_s,
            # A request in flight holds one connection (a correction adds a short non-stream call).
            max_connections=settings.max_concurrent_requests + 16,
            transport=upstream_transport,
        )
        fetcher = image_fetcher
        if fetcher is None and (settings.image_urls == "fetch" or any(cfg.fetch_images for cfg in settings.judges)):
            fetcher = ImageFetcher(settings.image_fetch)
        judges = {cfg.name: build_judge(cfg) for cfg in settings.judges}
        _instrument(watch.telemetry, generator, judges, settings)
        # outside the tracing wrappers: a call's span starts once it has a slot
        install_call_gate(_call_gate(settings, watch.built_metrics), generator, judges.values())
        if settings.hint_judge is not None and settings.hint_judge not in judges:
            raise ValueError(f"FAITHPROXY_HINT_JUDGE={settings.hint_judge!r} is not one of the configured judges")
        hidden = None
        if settings.hidden_states_layers:
            from faithproxy.clients.hidden_states import HiddenStatesClient

            hidden = HiddenStatesClient(
                generator, settings.hidden_states_layers, keep_files=settings.hidden_states_keep_files
            )
        deps = _detector_deps(settings, generator, judges, hidden, watch.built_metrics)

        def regenerator() -> Regenerator:
            return build_regenerator(
                settings.regenerator,
                generator,
                temperature=settings.regeneration_temperature,
                max_tokens=settings.regeneration_max_tokens,
                samples=settings.regeneration_samples,
                insist_share=settings.regeneration_insist_share,
                claims=settings.consistency_claims,
            )

        detectors: Mapping[str, Detector]
        if verifies_at_start(settings):
            detectors, rewriter = build_detectors(deps), regenerator()
        else:  # built by the first request that is verified (or asks for a detector by name)
            REGENERATORS.entry(settings.regenerator)  # an unknown name still stops the start; imports nothing
            detectors = DetectorsOnFirstUse(
                lambda: build_detectors(deps), lambda names: watch.built_metrics[0].preinit_detectors(names)
            )
            rewriter = RegeneratorOnFirstUse(regenerator)
        metrics = watch.metrics(list(detectors) if isinstance(detectors, dict) else [], list(judges), doors)
        state = AppState(
            settings=settings,
            generator=generator,
            detectors=detectors,
            judges=list(judges),
            regenerator=rewriter,
            metrics=metrics,
            tracer=TraceWriter(settings.trace_path),
            image_fetcher=fetcher,
            hidden_states=hidden if settings.record_features else None,
            hint_llm=judges.get(settings.hint_judge) if settings.hint_judge else None,
            reports=watch.reports,
            key_policies=watch.key_policies,
            doors=doors,
        )
        app.state.faithproxy = state
        # idle until an off request is sampled (the setting, or a key's share after a policy reload)
        state.shadow = ShadowChecker.from_state(state)
        _start_policies(watch.key_policies, metrics)
        fix_mmap_threshold(settings.heap_mmap_threshold_bytes)
        app.state.heap_trimmer = trimmer = HeapTrimmer(settings.heap_trim_interval_s)
        trimmer.start()
        try:
            listing = await generator.models()
            state.learn_models([m["id"] for m in listing.get("data", []) if isinstance(m, dict) and "id" in m])
        except (UpstreamError, ValueError):
            log.warning("upstream %s not reachable at start; /readyz will say so", settings.upstream_url)
        try:
            # The ASGI lifespan state: uvicorn hands it to each connection (server/admission/connections.py).
            yield {CONNECTIONS_STATE: connection_rules(settings, metrics)}
        finally:
            for detector in _built(detectors).values():
                await detector.aclose()  # the judge detector closes the judge backends it owns
            await generator.aclose()
            if fetcher is not None:
                await fetcher.aclose()
            if state.shadow is not None:
                await state.shadow.aclose()
            worker_exit()  # serve --workers N: this worker's in-flight gauge leaves the sum
            await watch.reports.aclose()  # Redis: the writes in flight land, this loop's connections close
            await _stop_operators_tools(watch.key_policies, watch.telemetry)
            await trimmer.stop()

    return lifespan


def verifies_at_start(settings: Settings) -> bool:
    """Whether the lifespan builds the detectors and the regenerator: a server that verifies by default,
    has a judge, a probe file or shadow checks. A server in off mode with none of them (off only) loads
    none of the correction machinery until a request asks for a verified mode or names a detector: its
    memory at rest is the pass-through's (issue 49). A configuration error that only building finds (a
    calibration file that does not read) then fails that first request, not the start."""
    return (
        settings.default_mode != "off"
        or bool(settings.judges)
        or settings.probe_path is not None
        or settings.shadow_share > 0
    )


class DetectorsOnFirstUse(Mapping[str, Detector]):
    """The detectors by name, built the first time anything looks at them (`build`), after which
    `on_built(names)` runs once (their metric series)."""

    def __init__(self, build: Callable[[], dict[str, Detector]], on_built: Callable[[list[str]], None]) -> None:
        self._build = build
        self._on_built = on_built
        self.built: dict[str, Detector] | None = None

    def _detectors(self) -> dict[str, Detector]:
        if self.built is None:
            self.built = self._build()
            self._on_built(list(self.built))
        return self.built

    def __getitem__(self, name: str) -> Detector:
        return self._detectors()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._detectors())

    def __len__(self) -> int:
        return len(self._detectors())


class RegeneratorOnFirstUse(Regenerator):
    """The regenerator, built at its first rewrite (`build`)."""

    name = "on-first-use"

    def __init__(self, build: Callable[[], Regenerator]) -> None:
        self._build = build
        self.built: Regenerator | None = None

    async def regenerate(self, view: RequestView, prefix: list[str], bad_step: Step, attempt: int) -> Regeneration:
        if self.built is None:
            self.built = self._build()
        return await self.built.regenerate(view, prefix, bad_step, attempt)


def _built(detectors: Mapping[str, Detector]) -> Mapping[str, Detector]:
    """The detectors built so far (none of a server whose first verified request never came)."""
    if isinstance(detectors, DetectorsOnFirstUse):
        return detectors.built or {}
    return detectors


def _detector_deps(
    settings: Settings,
    generator: VLLMClient,
    judges: dict[str, Any],
    hidden: Any,
    built_metrics: list[Metrics],
) -> DetectorDeps:
    return DetectorDeps(
        judges=judges,
        default_judge=settings.default_judge,
        generator=generator,
        # read by the probe's own from_deps: a bad file or a layer mismatch stops the start
        probe_path=settings.probe_path,
        hidden=hidden,
        cascade_low=settings.cascade_low,
        cascade_high=settings.cascade_high,
        cascade_rewrites=settings.cascade_rewrites,
        judge_samples=settings.judge_samples,
        consistency={
            "samples": settings.consistency_samples,
            "temperature": settings.consistency_temperature,
            "max_tokens": settings.consistency_max_tokens,
            "threshold": settings.consistency_threshold,
            "claims": settings.consistency_claims,
            "calibration": settings.consistency_calibration,
            "seeded": settings.consistency_seeded,
        },
        routed_routes=settings.routed_routes,
        on_cascade_decision=lambda stage, n: built_metrics[0].cascade_decisions.labels(stage).inc(n),
    )


def _add_routes(app: FastAPI, settings: Settings, doors: DoorTable) -> None:
    """The doors of the table, the operator's routes, errors in each door's format, the OpenAPI schema."""
    app.add_exception_handler(FaithproxyError, faithproxy_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.state.doors = doors  # the error handlers and the middleware find a request's door here
    app.include_router(door_routes(doors))
    app.include_router(ops_router.router)
    app.include_router(reports_router.router)
    app.include_router(pages_router.router)
    install_openapi(app, settings, doors)


def _add_middleware(app: FastAPI, settings: Settings, doors: DoorTable, watch: _Watchers) -> None:
    """Pure ASGI, outermost last added: tracing (when on), internal errors (500 in the door's format),
    request size (431/413), x-api-key as a bearer key on Anthropic's doors, API keys (401), concurrency
    (429), the routing key, then off mode's pure-ASGI pass-through (server/doors/off.py) in front of the
    router."""
    app.add_middleware(OffModeMiddleware, default_off=settings.default_mode == "off")
    # outside the pass-through: every upstream call of a request carries its routing key (docs/replicas.md)
    app.add_middleware(RoutingKeyMiddleware, header=settings.routing_header)
    app.add_middleware(
        ConcurrencyLimitMiddleware,
        limit=settings.max_concurrent_requests,
        retry_after_s=settings.retry_after_s,
        per_client=settings.max_requests_per_client,
        paths=doors.paths,
    )
    if settings.api_keys or watch.key_policies is not None:
        open_paths = ALWAYS_OPEN if settings.metrics_require_key else ALWAYS_OPEN | {"/metrics"}
        keys = [key.get_secret_value() for key in settings.api_keys]
        app.add_middleware(APIKeyMiddleware, keys=keys, open_paths=open_paths, more_keys=watch.key_policies)
    app.add_middleware(AnthropicKeyHeader)  # x-api-key on Anthropic's doors read as a bearer key, by all of the above
    app.add_middleware(
        RequestSizeMiddleware, max_body_bytes=settings.max_body_bytes, max_header_bytes=settings.max_header_bytes
    )
    # Outside every middleware but tracing's: an exception none of them answered is a 500 in the
    # door's format, logged with the request id and counted (server/runtime/internal_errors.py).
    app.add_middleware(InternalErrorMiddleware, doors=doors)
    if watch.telemetry is not None:  # outermost: every refusal is a traced request too
        app.add_middleware(otel.TracingMiddleware, telemetry=watch.telemetry)


def _call_gate(settings: Settings, built_metrics: list[Metrics]) -> CallGate:
    """The cap on verification calls upstream (clients/call_gate.py), counted in the app's metrics."""

    def on_wait(kind: str) -> None:
        if built_metrics:
            built_metrics[0].upstream_call_waits.labels(kind).inc()

    def on_slots(kind: str, change: int) -> None:
        if built_metrics:
            built_metrics[0].upstream_calls.labels(kind).inc(change)

    return CallGate(settings.max_concurrent_upstream_calls, on_wait=on_wait, on_slots=on_slots)


def _report_store(settings: Settings, built_metrics: list[Metrics]) -> Reports:
    """Redis when FAITHPROXY_REPORTS_URL names one (replicas share it; its failures counted in the app's
    metrics once its lifespan has made them), else the workers' SQLite file, else this process's memory."""
    bounds = (settings.reports_max_count, settings.reports_max_age_s)
    if settings.reports_url is not None:

        def count_error(operation: str) -> None:
            if built_metrics:
                built_metrics[0].report_store_errors.labels(operation).inc()

        from faithproxy.server.observe.reports_redis import RedisReportStore  # redis: only when configured

        url = settings.reports_url.get_secret_value()
        return RedisReportStore(url, *bounds, timeout_s=settings.reports_timeout_s, on_error=count_error)
    if settings.reports_path:
        return SharedReportStore(settings.reports_path, *bounds)
    return ReportStore(*bounds)


def _key_policies(settings: Settings, built_metrics: list[Metrics]) -> KeyPolicies | None:
    """The policy per API key of FAITHPROXY_POLICY_FILE (a broken file stops the start), counted in the
    app's metrics once its lifespan has made them."""
    if settings.policy_file is None:
        return None

    def on_reload(result: str) -> None:
        if built_metrics:
            built_metrics[0].policy_reloads.labels(result).inc()
            if result == "ok" and policies is not None:
                built_metrics[0].preinit_policies(policies.book.names)

    def on_request(name: str, outcome: str) -> None:
        if built_metrics:
            built_metrics[0].policy_requests.labels(name, outcome).inc()

    policies: KeyPolicies | None = None
    policies = KeyPolicies(settings.policy_file, on_reload=on_reload, on_request=on_request)
    return policies


def _on_sighup(reload: Callable[[], object] | None) -> None:
    """SIGHUP reloads the policy file (None: no longer). The handler runs in the event loop between
    requests' steps, so a stream in flight goes on with what it was admitted with."""
    if not hasattr(signal, "SIGHUP"):
        return
    loop = asyncio.get_running_loop()
    try:
        if reload is None:
            loop.remove_signal_handler(signal.SIGHUP)
        else:
            loop.add_signal_handler(signal.SIGHUP, reload)
    except (RuntimeError, ValueError):  # not the main thread's loop (a test's threaded server)
        log.warning("SIGHUP cannot reload the policy file in this event loop; it is read at start only")


def _instrument(
    telemetry: otel.Telemetry | None, generator: VLLMClient, judges: dict[str, Any], settings: Settings
) -> None:
    """CLIENT spans for upstream and judge calls, and traceparent to vLLM, when tracing is on."""
    if telemetry is None:
        return
    telemetry.trace_upstream(generator)
    for cfg in settings.judges:
        telemetry.trace_judge(judges[cfg.name], cfg.backend)


def _start_policies(key_policies: KeyPolicies | None, metrics: Metrics) -> None:
    """The policies' series, and SIGHUP to reload them."""
    if key_policies is not None:
        metrics.preinit_policies(key_policies.book.names)
        _on_sighup(key_policies.reload)


async def _stop_operators_tools(key_policies: KeyPolicies | None, telemetry: otel.Telemetry | None) -> None:
    """At the lifespan's end: SIGHUP no longer reloads; queued spans are exported."""
    if key_policies is not None:
        _on_sighup(None)
    if telemetry is not None:
        await asyncio.to_thread(telemetry.flush)  # bounded: a collector that is down costs 2 s
