"""`finish_request`: the one place a finished request is counted, put on its OpenTelemetry span and
written as a trace record, whichever door or mode served it. It sits above metrics, otel and traces so
that none of them needs another."""

from __future__ import annotations

import logging
import time

from faithproxy.faithcore.errors import UpstreamError
from faithproxy.server.observe.metrics import Metrics, ShadowOutcome, Source, upstream_error_label
from faithproxy.server.observe.otel import record_request
from faithproxy.server.observe.step_metrics import perception_verdicts
from faithproxy.server.observe.traces import RequestTrace, TraceWriter

log = logging.getLogger("faithproxy")


def finish_request(trace: RequestTrace, metrics: Metrics, tracer: TraceWriter) -> None:
    """Counts a finished request (requests by status class, duration, an upstream error's reason) and
    writes its trace record when the server keeps traces. Call it once per request."""
    admitted = trace.admitted
    mode = admitted.policy.mode
    duration = time.perf_counter() - admitted.started
    status = trace.status
    if trace.error is not None:
        status = trace.error.status_code
        if isinstance(trace.error, UpstreamError):
            metrics.upstream_errors.labels(upstream_error_label(trace.error)).inc()
    status_class = "disconnected" if trace.disconnected else f"{status // 100}xx"
    metrics.requests.labels(mode, admitted.policy.detector, status_class, admitted.endpoint).inc()
    metrics.request_duration.labels(mode, "true" if admitted.stream else "false", admitted.endpoint).observe(duration)
    if mode == "off":  # a sampled one is counted by its shadow check's outcome (server/shadow/checker.py)
        if not admitted.shadow:
            model = metrics.model_label(admitted.body.get("model"))
            metrics.shadow_requests.labels(model, admitted.endpoint, ShadowOutcome.NOT_SAMPLED).inc()
    elif trace.steps:
        model = metrics.model_label(admitted.body.get("model"))
        metrics.count_perception(Source.INLINE, model, admitted.endpoint, perception_verdicts(trace.steps))
    record_request(trace)  # on the request's OpenTelemetry span, when one is recording (server/observe/otel.py)
    if tracer.path is None:  # no record built for a server that writes no traces
        return
    try:
        tracer.write(trace.record(duration))
    except OSError:
        log.exception("could not write the trace of %s", admitted.request_id)
