"""Every Prometheus metric of faithproxy, in one place.

Naming follows the Prometheus conventions (faithproxy_ prefix, base units, _total counters); label
values come from small fixed sets. Series for the known label values are created up front so that
rate() works before the first event.

UPR in PromQL (each perception step is counted once in faithproxy_steps_total, with the verdict its
ORIGINAL text got; faithproxy_residual_steps_total counts perception steps delivered still unfaithful
or unchecked):

  detected UPR = sum(rate(faithproxy_steps_total{kind="perception",verdict="unfaithful"}[5m]))
               / sum(rate(faithproxy_steps_total{kind="perception"}[5m]))
  residual UPR = sum(rate(faithproxy_residual_steps_total[5m]))
               / sum(rate(faithproxy_steps_total{kind="perception"}[5m]))

The judge's bill: faithproxy_judge_tokens_total{judge,kind,policy} counts every judge call's tokens as it
returns, kind input (fresh prompt tokens), cached_input (read from the judge's prompt cache),
cache_creation (written to it) and output, and policy the name of the API key's policy that sent the
request (server/admission/key_policy.py; "default" without a policy file);
faithproxy_judge_calls_total{judge} the calls.

  judge tokens per perception step = sum(rate(faithproxy_judge_tokens_total[5m]))
                                   / sum(rate(faithproxy_steps_total{kind="perception"}[5m]))
  cache hit share = sum(rate(faithproxy_judge_tokens_total{kind="cached_input"}[5m]))
                  / sum(rate(faithproxy_judge_tokens_total{kind!="output"}[5m]))

The judge gate: faithproxy_gated_steps_total{detector,model} counts steps kept from a detector that types
steps itself because the step typer found no perception step in their batch.

  gated share = sum(rate(faithproxy_gated_steps_total[5m])) / sum(rate(faithproxy_steps_total[5m]))
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from faithproxy.clients import call_gate
from faithproxy.detectors.registry import decision_stages
from faithproxy.faithcore.context import JudgeUsage
from faithproxy.faithcore.errors import DetectorErrorCode, UpstreamErrorCode, UpstreamStatusError
from faithproxy.faithcore.outcomes import ResumeOutcome, TryOutcome

KINDS = ("perception", "reasoning")
VERDICTS = ("faithful", "unfaithful", "unknown", "unsure")
MODES = ("correct", "detect", "off")
# budget: the request's judge budget was spent (detectors/judge.py), the step was never sent
UNCHECKED_REASONS = ("detector_error", "detector_none", "regeneration_budget", "request_failed", "budget")
RESIDUAL_REASONS = ("regeneration_failed", "not_corrected", "unchecked")
ATTEMPT_OUTCOMES = tuple(TryOutcome)  # the outcomes the machine emits (faithcore/outcomes.py)
STEP_OUTCOMES = ("fixed", "failed")
REQUEST_STATUSES = ("2xx", "4xx", "5xx", "disconnected")
# The `endpoint` label is the path of the door a request came through: its values are the app's door
# table (server/protocol/doors.py), handed to Metrics as `endpoints`.
# The error reasons are the error codes: every code an error can carry is a label, pre-initialised.
UPSTREAM_ERRORS = tuple(code.value for code in UpstreamErrorCode)
DETECTOR_ERRORS = tuple(code.value for code in DetectorErrorCode)
# The stages a detector may report a decision for (the cascade: probe, judge), as the detectors declare them:
# read from the registry's copies of their declarations, so importing this module loads no detector.
CASCADE_STAGES = decision_stages()
HINT_OUTCOMES = ("applied", "unusable", "error")
POLICY_OUTCOMES = ("admitted", "refused")
# resumed: a broken upstream stream was continued by a new round; exhausted: no attempt was left, the
# request failed (server/chain/session.py; the rule is faithcore/correction/machine.py's)
RESUME_OUTCOMES = tuple(ResumeOutcome)
REPORT_STORE_OPERATIONS = ("write", "read")
POLICY_RELOAD_RESULTS = ("ok", "failed")
# The `kind` of faithproxy_judge_tokens_total, each a field of JudgeUsage.
JUDGE_TOKEN_KINDS = {
    "input": "input_tokens",
    "cached_input": "cached_input_tokens",
    "cache_creation": "cache_creation_tokens",
    "output": "output_tokens",
}


class Source(StrEnum):
    """Where a perception step's verdict came from: `inline`, checked while it was served (correct,
    detect); `shadow`, checked after an off-mode request ended (server/shadow/checker.py)."""

    INLINE = "inline"
    SHADOW = "shadow"


class ShadowOutcome(StrEnum):
    """What became of an off-mode request, as shadow sampling saw it (faithproxy_shadow_requests_total)."""

    NOT_SAMPLED = "not_sampled"  # not drawn at the share
    CHECKED = "checked"  # verified; its perception steps counted with source="shadow"
    QUEUE_FULL = "queue_full"  # drawn, but the shadow queue was full: dropped
    OVER_BUDGET = "over_budget"  # drawn, but the shadow token budget of the minute was spent: dropped
    UNREADABLE = "unreadable"  # drawn, but nothing to check: failed, cut off, over shadow_max_bytes, no chain
    FAILED = "failed"  # the check itself failed (the detector, the judge): counted, nothing else lost


class RefusalReason(StrEnum):
    """Why a request was refused before it was served (faithproxy_refusals_total)."""

    AUTHENTICATION = "authentication"  # 401: no valid API key
    POLICY = "policy"  # 403: the key's policy; 400: a header, body or image the proxy does not take
    LIMITS = "limits"  # 413, 431, 429: size, concurrency, per-client limits
    TIMEOUTS = "timeouts"  # 408: headers or body too slow


class CallKind(StrEnum):
    """The upstream calls verification makes, under FAITHPROXY_MAX_CONCURRENT_UPSTREAM_CALLS (clients/call_gate.py)."""

    JUDGE = call_gate.JUDGE
    GENERATOR = call_gate.GENERATOR  # regenerations, self-checks and hidden-state reads sent to vLLM


def detector_error_label(exc: Exception) -> str:
    """The `reason` label of faithproxy_detector_errors_total for a detector failure (a DetectorError
    without a code, or any other exception, counts as "other")."""
    try:
        return DetectorErrorCode(getattr(exc, "code", None)).value
    except ValueError:
        return DetectorErrorCode.OTHER.value


def upstream_error_label(exc: Exception) -> str:
    """The `reason` label of faithproxy_upstream_errors_total for a failure talking to vLLM."""
    try:
        return UpstreamErrorCode(getattr(exc, "code", None)).value
    except ValueError:  # no code: vLLM's own error status, or something unforeseen
        return (UpstreamErrorCode.STATUS if isinstance(exc, UpstreamStatusError) else UpstreamErrorCode.OTHER).value


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


CONNECTION_CLOSE_REASONS = ("header_timeout", "body_timeout", "idle_timeout", "too_many_connections")
# The `door` of faithproxy_internal_errors_total (server/runtime/internal_errors.py): a door's path, or this.
NOT_A_DOOR = "other"
OTHER_MODEL = "other"  # the `model` label of a model the upstream does not list


class Metrics:
    """All metrics, bound to one registry (a fresh one per test app, the default one in production)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        detectors: Iterable[str] = (),
        judges: Iterable[str] = (),
        *,
        endpoints: Iterable[str] = (),
    ) -> None:
        self.registry = registry
        self.endpoints = tuple(endpoints)  # the doors' paths: every `endpoint` series starts at zero
        self.requests = Counter(
            "faithproxy_requests_total",
            "Requests by mode, detector, HTTP status class and endpoint (the door: its path).",
            ["mode", "detector", "status", "endpoint"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "faithproxy_requests_in_flight",
            "Chat completion requests being served.",
            registry=registry,
            multiprocess_mode="livesum",  # serve --workers N: the live workers' values added up
        )
        self.steps = Counter(
            "faithproxy_steps_total",
            "Chain steps by kind, by the verdict their original text got, by detector and model.",
            ["kind", "verdict", "detector", "model"],
            registry=registry,
        )
        self.residual = Counter(
            "faithproxy_residual_steps_total",
            "Perception steps delivered to the client still unfaithful or unchecked.",
            ["detector", "model", "reason"],
            registry=registry,
        )
        self.unchecked = Counter(
            "faithproxy_unchecked_steps_total",
            "Perception steps that got no verdict, by reason.",
            ["detector", "model", "reason"],
            registry=registry,
        )
        self.gated_steps = Counter(
            "faithproxy_gated_steps_total",
            "Steps sent to no detector because the step typer found no perception step in their batch, for "
            "a detector that types steps itself (the judge gate; FAITHPROXY_JUDGE_EVERY_STEP=true turns it off).",
            ["detector", "model"],
            registry=registry,
        )
        self.regeneration_attempts = Counter(
            "faithproxy_regeneration_attempts_total",
            "Regeneration tries by outcome (unparseable: no bracketed rewrite, or nothing new).",
            ["outcome"],
            registry=registry,
        )
        self.regeneration_outcomes = Counter(
            "faithproxy_regeneration_outcomes_total",
            "Regenerated steps by final outcome and the number of tries it took (Table 12 of the paper).",
            ["outcome", "attempts"],
            registry=registry,
        )
        self.detector_latency = Histogram(
            "faithproxy_detector_latency_seconds",
            "Wall time of one detector call (one batch).",
            ["detector"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.detector_batch = Histogram(
            "faithproxy_detector_batch_steps",
            "Steps sent to the detector in one call.",
            ["detector"],
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
            registry=registry,
        )
        self.detector_errors = Counter(
            "faithproxy_detector_errors_total",
            "Detector calls that failed, by reason.",
            ["detector", "reason"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "faithproxy_upstream_errors_total",
            "Failures talking to vLLM, by reason.",
            ["reason"],
            registry=registry,
        )
        self.upstream_resumes = Counter(
            "faithproxy_upstream_resumes_total",
            "Upstream streams that broke mid-round in correct/detect mode, by outcome: resumed (a new "
            "round continued the chain) or exhausted (no resume attempt left: the request failed).",
            ["outcome"],
            registry=registry,
        )
        for outcome in RESUME_OUTCOMES:
            self.upstream_resumes.labels(outcome)
        self.request_duration = Histogram(
            "faithproxy_request_duration_seconds",
            "Request duration as seen by the proxy.",
            ["mode", "stream", "endpoint"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "faithproxy_time_to_first_token_seconds",
            "Time from request to the first text byte sent to the client (streams).",
            ["mode", "endpoint"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.verification_seconds = Counter(
            "faithproxy_verification_seconds_total",
            "Time spent waiting on verification (detector and regeneration) that delayed the client.",
            ["mode"],
            registry=registry,
        )
        self.client_disconnects = Counter(
            "faithproxy_client_disconnects_total",
            "Streams whose client went away before the end.",
            registry=registry,
        )
        self.client_connections_closed = Counter(
            "faithproxy_client_connections_closed_total",
            "Client connections the proxy closed, by reason (server/admission/connections.py: header_timeout and "
            "body_timeout, answered 408 where a response could still be sent; idle_timeout: keep-alive; "
            "too_many_connections: one address over its limit, answered 429).",
            ["reason"],
            registry=registry,
        )
        for reason in CONNECTION_CLOSE_REASONS:
            self.client_connections_closed.labels(reason)
        self.internal_errors = Counter(
            "faithproxy_internal_errors_total",
            "Requests that failed with an exception no handler answered (a bug: server/runtime/internal_errors.py "
            "answers 500 in the door's format and logs it with the request id), by door.",
            ["door"],
            registry=registry,
        )
        for door in (*self.endpoints, NOT_A_DOOR):
            self.internal_errors.labels(door)
        self.abandoned_requests = Counter(
            "faithproxy_abandoned_requests_total",
            "Requests whose client left before the answer was complete: their work was cancelled "
            "(server/admission/client_gone.py), streamed or not.",
            registry=registry,
        )
        self.cascade_decisions = Counter(
            "faithproxy_cascade_decisions_total",
            "Perception steps the cascade detector decided, by the stage that decided them.",
            ["stage"],
            registry=registry,
        )
        self.hint_requests = Counter(
            "faithproxy_hint_requests_total",
            "Requests that asked for hints, by outcome (applied; unusable: no hints in the reply; error).",
            ["outcome"],
            registry=registry,
        )
        self.hint_latency = Histogram(
            "faithproxy_hint_seconds",
            "Time to get the hints of a request from the hint judge (the generator waits for it).",
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.judge_tokens = Counter(
            "faithproxy_judge_tokens_total",
            "Judge tokens by judge and kind (input: fresh prompt tokens; cached_input: read from the judge's "
            "prompt cache; cache_creation: written to it; output), and by the name of the API key's policy "
            "(FAITHPROXY_POLICY_FILE; default without one).",
            ["judge", "kind", "policy"],
            registry=registry,
        )
        self.judge_calls = Counter(
            "faithproxy_judge_calls_total",
            "Judge calls made by the detectors, by judge.",
            ["judge"],
            registry=registry,
        )
        self.policy_requests = Counter(
            "faithproxy_policy_requests_total",
            "Requests by the API key policy they were read against (its name, never the key; "
            "FAITHPROXY_POLICY_FILE) and outcome (admitted, refused: 403).",
            ["policy", "outcome"],
            registry=registry,
        )
        self.otel_spans_dropped = Counter(
            "faithproxy_otel_spans_dropped_total",
            "OpenTelemetry spans not exported (server/observe/otel.py): dropped from the full export queue, or in "
            "an export that failed (collector down). Requests are never held up by the export.",
            registry=registry,
        )
        self.report_store_errors = Counter(
            "faithproxy_report_store_errors_total",
            "Calls to the shared report store (Redis, FAITHPROXY_REPORTS_URL) that failed, by operation: "
            "write (a finished request's report not stored; the request was served) and read (a lookup "
            "answered 503).",
            ["operation"],
            registry=registry,
        )
        for operation in REPORT_STORE_OPERATIONS:
            self.report_store_errors.labels(operation)
        self.policy_reloads = Counter(
            "faithproxy_policy_reloads_total",
            "Reloads of the policy file (SIGHUP) by result (ok; failed: the policies in force were kept).",
            ["result"],
            registry=registry,
        )
        self.perception_steps = Counter(
            "faithproxy_perception_steps_total",
            "Perception steps by the verdict their original text got, by source (inline: checked as served, "
            "correct and detect; shadow: checked after an off request ended), model and endpoint: the fleet's "
            "UPR and its sample size (tests/deploy/upr_queries.py: the rate with its 95% Wilson interval).",
            ["source", "model", "endpoint", "verdict"],
            registry=registry,
        )
        self.shadow_requests = Counter(
            "faithproxy_shadow_requests_total",
            "Off-mode requests by what shadow sampling did with them (not_sampled, checked, queue_full, "
            "over_budget, unreadable, failed), by model and endpoint: the sampled share.",
            ["model", "endpoint", "outcome"],
            registry=registry,
        )
        self.shadow_queue = Gauge(
            "faithproxy_shadow_queue_depth",
            "Shadow checks waiting or running (at most FAITHPROXY_SHADOW_QUEUE wait).",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.shadow_tokens = Counter(
            "faithproxy_shadow_tokens_total",
            "Tokens shadow checks spent (judge tokens as the judge budget counts them, and generator tokens of "
            "self-checks), against FAITHPROXY_SHADOW_TOKENS_PER_MINUTE.",
            registry=registry,
        )
        self.refusals = Counter(
            "faithproxy_refusals_total",
            "Requests refused before they were served, by reason (authentication, policy, limits, timeouts) "
            "and endpoint (a door's path, or other).",
            ["reason", "endpoint"],
            registry=registry,
        )
        for reason in RefusalReason:
            for endpoint in (*self.endpoints, NOT_A_DOOR):
                self.refusals.labels(reason, endpoint)
        self.upstream_calls = Gauge(
            "faithproxy_upstream_calls_in_flight",
            "Verification calls open upstream (judge; generator: regenerations and self-checks), under "
            "FAITHPROXY_MAX_CONCURRENT_UPSTREAM_CALLS.",
            ["kind"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.upstream_call_waits = Counter(
            "faithproxy_upstream_call_waits_total",
            "Verification calls that waited for a free slot under FAITHPROXY_MAX_CONCURRENT_UPSTREAM_CALLS.",
            ["kind"],
            registry=registry,
        )
        for kind in CallKind:
            self.upstream_calls.labels(kind)
            self.upstream_call_waits.labels(kind)
        self._models: set[str] = set()  # the upstream's models: the only `model` label values but "other"
        self._judges: list[str] = []  # the configured judges, for the series of policies learnt later
        self._detectors: list[str] = []  # the built detectors, for the series of models learnt later
        self._preinit()
        self.preinit_detectors(detectors)
        self.preinit_judges(judges)
        self.preinit_fleet_model(OTHER_MODEL)

    def preinit_policies(self, names: Iterable[str]) -> None:
        """Create the series of the policy file's policies and of its reloads."""
        for result in POLICY_RELOAD_RESULTS:
            self.policy_reloads.labels(result)
        for name in names:
            for outcome in POLICY_OUTCOMES:
                self.policy_requests.labels(name, outcome)
        self.preinit_judges((), names)

    def preinit_judges(self, judges: Iterable[str], policies: Iterable[str] = ("default",)) -> None:
        """Create the judge-bill series of every configured judge (for each key policy), so their rates
        exist at zero."""
        self._judges = list(dict.fromkeys([*self._judges, *judges]))
        for judge in self._judges:
            self.judge_calls.labels(judge)
            for kind in JUDGE_TOKEN_KINDS:
                for policy in policies:
                    self.judge_tokens.labels(judge, kind, policy)

    def count_judge_call(self, judge: str, call: JudgeUsage, policy: str = "default") -> None:
        """One judge call's bill (RequestView.judge_state.on_call); `policy`: the API key policy's name."""
        self.judge_calls.labels(judge).inc(call.calls)
        for kind, name in JUDGE_TOKEN_KINDS.items():
            self.judge_tokens.labels(judge, kind, policy).inc(getattr(call, name))

    def preinit_detectors(self, detectors: Iterable[str]) -> None:
        """Create the series of built detectors, and their UPR series for every model known so far: at
        start, or when a server that verifies nothing at start builds its detectors (server/app.py)."""
        new = [name for name in detectors if name not in self._detectors]
        self._detectors += new
        for name in new:
            self.detector_latency.labels(name)
            self.detector_batch.labels(name)
            for reason in DETECTOR_ERRORS:
                self.detector_errors.labels(name, reason)
            for mode in MODES:
                for status in REQUEST_STATUSES:
                    for endpoint in self.endpoints:
                        self.requests.labels(mode, name, status, endpoint)
            for model in self._models:
                self._preinit_detector_model(name, model)

    def _preinit(self) -> None:
        for stage in CASCADE_STAGES:
            self.cascade_decisions.labels(stage)
        for outcome in HINT_OUTCOMES:
            self.hint_requests.labels(outcome)
        for outcome in ATTEMPT_OUTCOMES:
            self.regeneration_attempts.labels(outcome)
        for outcome in STEP_OUTCOMES:
            for attempts in range(0, 11):  # K is 0..10
                self.regeneration_outcomes.labels(outcome, str(attempts))
        for reason in UPSTREAM_ERRORS:
            self.upstream_errors.labels(reason)
        for mode in MODES:
            self.verification_seconds.labels(mode)
            for endpoint in self.endpoints:
                self.ttft.labels(mode, endpoint)
                for stream in ("true", "false"):
                    self.request_duration.labels(mode, stream, endpoint)

    def model_label(self, model: object) -> str:
        """A request's `model` label: a model the upstream lists, else "other"."""
        return model if isinstance(model, str) and model in self._models else OTHER_MODEL

    def count_perception(self, source: Source, model: str, endpoint: str, verdicts: Iterable[str]) -> None:
        """One checked request's perception steps, each by the verdict its original text got."""
        for verdict in verdicts:
            self.perception_steps.labels(source, model, endpoint, verdict).inc()

    def preinit_fleet_model(self, model: str) -> None:
        """The series of the fleet's UPR (by source and endpoint) and of the sampled share for a model."""
        for endpoint in self.endpoints:
            for source in Source:
                for verdict in VERDICTS:
                    self.perception_steps.labels(source, model, endpoint, verdict)
            for outcome in ShadowOutcome:
                self.shadow_requests.labels(model, endpoint, outcome)

    def preinit_model(self, model: str, detectors: Iterable[str] | None = None) -> None:
        """Create the UPR series for a model once it is known, so both UPR ratios exist at zero: for
        `detectors`, or for the detectors built so far (preinit_detectors covers those built later)."""
        self._models.add(model)
        self.preinit_fleet_model(model)
        for detector in self._detectors if detectors is None else detectors:
            self._preinit_detector_model(detector, model)

    def _preinit_detector_model(self, detector: str, model: str) -> None:
        for kind in KINDS:
            for verdict in VERDICTS:
                self.steps.labels(kind, verdict, detector, model)
        for reason in RESIDUAL_REASONS:
            self.residual.labels(detector, model, reason)
        for reason in UNCHECKED_REASONS:
            self.unchecked.labels(detector, model, reason)
        self.gated_steps.labels(detector, model)
