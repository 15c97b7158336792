"""OpenTelemetry traces, configured by the standard OTEL_* variables; off when none is set.

On when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, or OTEL_TRACES_EXPORTER
names an exporter (otlp, console); off when OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. The
SDK reads the rest itself: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (service.name defaults to
faithproxy), OTEL_EXPORTER_OTLP_* (endpoint, headers, protocol http/protobuf or grpc), OTEL_BSP_* (the
batch processor's bounded queue, batch size and delay).

What a request becomes (GenAI semantic conventions):

    SERVER  POST /v1/chat/completions        http.*, gen_ai.request.model, faithproxy.* (request id,
    │                                        mode, detector, key policy); one event per checked step:
    │                                        gen_ai.evaluation.result (name faithfulness, label
    │                                        faithful | unfaithful | fixed | residual | unchecked,
    │                                        explanation: the judge's reason)
    └── CLIENT  chat {judge model}           one per judge call: gen_ai.operation.name, gen_ai.provider.name,
                                             gen_ai.request.model, gen_ai.usage.input_tokens (all prompt
                                             tokens), gen_ai.usage.cache_read.input_tokens,
                                             gen_ai.usage.cache_creation.input_tokens, gen_ai.usage.output_tokens

The export never blocks or fails a request: spans go to the SDK's BatchSpanProcessor (a bounded queue
exported from its own thread; when full, spans are dropped), and an export that fails counts its spans
in faithproxy_otel_spans_dropped_total. The app owns its TracerProvider (not the global one), so several
apps in one process keep their traces apart.

OpenTelemetry is imported when tracing is on (`from_environment` makes a Telemetry), never by importing
this module: a server without OTEL_* variables loads none of it (issue 49; tests/server/test_at_rest.py).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import types
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from faithproxy.clients.vllm import CHAT_PATH
from faithproxy.faithcore.types import Faithfulness

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter

    from faithproxy.clients.judge_base import JudgeBackend
    from faithproxy.clients.vllm import UpstreamBody, VLLMClient
    from faithproxy.faithcore.types import Step
    from faithproxy.server.observe.traces import RequestTrace

log = logging.getLogger(__name__)

TRACED_PATHS = ("/v1/",)  # the API; probes and /metrics make no spans
EVALUATION_EVENT = "gen_ai.evaluation.result"


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the OTEL_* variables ask for traces (module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return bool(exporter or endpoint)


@functools.cache
def _api() -> types.SimpleNamespace:
    """The OpenTelemetry API names this module uses, imported the first time a span is made."""
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    return types.SimpleNamespace(context=context, trace=trace, SpanKind=SpanKind, Status=Status, StatusCode=StatusCode)


def from_environment(on_dropped: Callable[[int], None], environ: Mapping[str, str] = os.environ) -> Telemetry | None:
    """The app's Telemetry when the OTEL_* variables ask for traces, else None (nothing imported)."""
    return Telemetry(_exporter(environ), on_dropped) if enabled(environ) else None


def _exporter(environ: Mapping[str, str]) -> SpanExporter:
    """The exporter OTEL_TRACES_EXPORTER names (otlp by default), over the protocol the OTLP variables name."""
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    if protocol.strip() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


@functools.cache
def _counting() -> tuple[type, type]:
    """(CountingExporter, CountingBatchProcessor): the SDK's exporter and batch processor with what they
    drop counted, defined at the first Telemetry (they subclass the SDK's classes)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        """The exporter, with the spans of each failed export counted (`on_dropped(n)`)."""

        def __init__(self, inner: SpanExporter, on_dropped: Callable[[int], None]) -> None:
            self.inner = inner
            self.on_dropped = on_dropped

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            try:
                result = self.inner.export(spans)
            except Exception:  # noqa: BLE001 - an exporter's bug must not stop the export thread
                log.exception("span export failed")
                result = SpanExportResult.FAILURE
            if result is not SpanExportResult.SUCCESS:
                self.on_dropped(len(spans))
            return result

        def shutdown(self) -> None:
            self.inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return self.inner.force_flush(timeout_millis)

    class CountingBatchProcessor(BatchSpanProcessor):
        """The SDK's batch processor, with the spans its full queue drops counted (`on_dropped(1)`)."""

        def __init__(self, exporter: SpanExporter, on_dropped: Callable[[int], None]) -> None:
            super().__init__(exporter)  # the queue's bound, batch size and delay from OTEL_BSP_*
            self._on_dropped = on_dropped

        def on_end(self, span: ReadableSpan) -> None:
            batch = getattr(self, "_batch_processor", None)  # the SDK's queue: it drops the oldest when full
            queue = getattr(batch, "_queue", None)
            if queue is not None and len(queue) >= getattr(batch, "_max_queue_size", len(queue) + 1):
                self._on_dropped(1)
            super().on_end(span)

    return CountingExporter, CountingBatchProcessor


class Telemetry:
    """One app's tracer: its provider, batch processor and exporter."""

    def __init__(self, exporter: SpanExporter, on_dropped: Callable[[int], None]) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        counting_exporter, counting_processor = _counting()
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "faithproxy"})
        self.provider = TracerProvider(resource=resource)
        self.processor = counting_processor(counting_exporter(exporter, on_dropped), on_dropped)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("faithproxy")

    @classmethod
    def from_environment(
        cls, on_dropped: Callable[[int], None], environ: Mapping[str, str] = os.environ
    ) -> Telemetry | None:
        return from_environment(on_dropped, environ)

    def flush(self, timeout_s: float = 2.0) -> None:
        """Exports what is queued, waiting at most `timeout_s` (the server is stopping)."""
        self.provider.force_flush(int(timeout_s * 1000))

    def trace_upstream(self, generator: VLLMClient) -> None:
        """Each upstream call (first round, rewrite, continuation) becomes a CLIENT span, child of the
        request's span, whose W3C traceparent vLLM receives (so its own spans join the trace); the span
        ends with the response's body and carries the usage and finish reasons of its last chunks."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        open_chat, chat = generator.open_chat, generator.chat
        propagator = TraceContextTextMapPropagator()
        trace = _api().trace

        def headers() -> dict[str, str]:
            carrier: dict[str, str] = {}
            propagator.inject(carrier)
            return carrier

        @functools.wraps(open_chat)
        async def traced_open(content: bytes, *, stream: bool, **kwargs: Any) -> Any:
            span = self._upstream_span(_model_of(content), str(kwargs.get("path", CHAT_PATH)))
            try:
                with trace.use_span(span, end_on_exit=False):
                    body = await open_chat(content, stream=stream, **kwargs)
            except BaseException as exc:
                _fail(span, exc)
                raise
            span.set_attribute("http.response.status_code", body.status)
            return TracedBody(body, span)

        @functools.wraps(chat)
        async def traced_chat(body: dict[str, Any]) -> dict[str, Any]:
            span = self._upstream_span(str(body.get("model", "")), CHAT_PATH)
            try:
                with trace.use_span(span, end_on_exit=False):
                    reply = await chat(body)
            except BaseException as exc:
                _fail(span, exc)
                raise
            _set_reply(span, reply)
            span.end()
            return reply

        generator.request_headers = headers
        generator.open_chat = traced_open  # type: ignore[method-assign]
        generator.chat = traced_chat  # type: ignore[method-assign]

    def _upstream_span(self, model: str, path: str) -> Any:
        operation = "text_completion" if path.endswith("/completions") and "chat" not in path else "chat"
        attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "vllm",
            "gen_ai.request.model": model,
            "url.path": path,
        }
        return self.tracer.start_span(f"{operation} {model}", kind=_api().SpanKind.CLIENT, attributes=attributes)

    def trace_judge(self, judge: JudgeBackend, provider: str) -> None:
        """Each call of `judge` becomes a CLIENT span, child of the request's span."""
        complete = judge.complete
        client_kind = _api().SpanKind.CLIENT

        @functools.wraps(complete)
        async def traced(*args: Any, **kwargs: Any) -> Any:
            attributes = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": judge.model,
                "faithproxy.judge": judge.name,
            }
            with self.tracer.start_as_current_span(
                f"chat {judge.model}", kind=client_kind, attributes=attributes
            ) as span:
                result = await complete(*args, **kwargs)
                span.set_attributes(_judge_usage(result))
                return result

        judge.complete = traced  # type: ignore[method-assign]


def _judge_usage(result: Any) -> dict[str, int]:
    cached, created = result.cached_input_tokens, result.cache_creation_tokens
    return {
        "gen_ai.usage.input_tokens": result.input_tokens + cached + created,  # all prompt tokens, per semconv
        "gen_ai.usage.cache_read.input_tokens": cached,
        "gen_ai.usage.cache_creation.input_tokens": created,
        "gen_ai.usage.output_tokens": result.output_tokens,
    }


class TracingMiddleware:
    """Pure ASGI: a SERVER span around each API request, current while the request is served (its
    stream included), so judge calls made for it are its children."""

    def __init__(self, app: ASGIApp, *, telemetry: Telemetry) -> None:
        self.app = app
        self.tracer = telemetry.tracer
        self.otel = _api()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(TRACED_PATHS):
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        attributes = {"http.request.method": method, "url.path": path, "gen_ai.operation.name": "chat"}
        otel = self.otel
        span = self.tracer.start_span(f"{method} {path}", kind=otel.SpanKind.SERVER, attributes=attributes)
        token = otel.context.attach(otel.trace.set_span_in_context(span))

        async def send_and_note(message: Message) -> None:  # a stream's start and end only (sse.py `body_send`)
            if message["type"] == "http.response.start":
                span.set_attribute("http.response.status_code", message["status"])
                if message["status"] >= 500:
                    span.set_status(otel.Status(otel.StatusCode.ERROR))
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            otel.context.detach(token)
            span.end()


def _model_of(content: bytes) -> str:
    """The request body's model, read without parsing the whole body (it can hold images)."""
    at = content.find(b'"model"')
    if at < 0:
        return ""
    start = content.find(b'"', content.find(b":", at) + 1)
    end = content.find(b'"', start + 1)
    return content[start + 1 : end].decode("utf-8", "replace") if start > 0 and end > start else ""


def _fail(span: Any, exc: BaseException) -> None:
    api = _api()
    span.set_status(api.Status(api.StatusCode.ERROR, type(exc).__name__))
    span.set_attribute("error.type", type(exc).__name__)
    span.end()


def _set_reply(span: Any, reply: Mapping[str, Any]) -> None:
    """A completion's (or a stream's last chunks') usage and finish reasons, as GenAI attributes."""
    usage = reply.get("usage") or {}
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        span.set_attribute("gen_ai.usage.input_tokens", int(usage.get("prompt_tokens") or 0))
        span.set_attribute("gen_ai.usage.output_tokens", int(usage.get("completion_tokens") or 0))
        span.set_attribute("gen_ai.usage.cache_read.input_tokens", int(details.get("cached_tokens") or 0))
    reasons = [c.get("finish_reason") for c in reply.get("choices") or () if c.get("finish_reason")]
    if reasons:
        span.set_attribute("gen_ai.response.finish_reasons", reasons)
    if reply.get("id"):
        span.set_attribute("gen_ai.response.id", str(reply["id"]))


class TracedBody:
    """An upstream body whose span ends when it is closed. A stream keeps only its last two reads, where
    the usage chunk and the finish reason are, so tracing costs no parsing per token."""

    def __init__(self, body: UpstreamBody, span: Any) -> None:
        self._body = body
        self._span = span
        self.status = body.status
        self.headers = body.headers
        self._tail: list[bytes] = []
        self._stream = False
        self._ended = False

    async def iter_raw(self) -> AsyncIterator[bytes]:
        self._stream = True
        async for data in self._body.iter_raw():
            self._tail = [self._tail[-1], data] if self._tail else [data]
            yield data

    async def read(self) -> bytes:
        data = await self._body.read()
        self._tail = [data]
        return data

    async def aclose(self) -> None:
        try:
            await self._body.aclose()
        finally:
            self._end()

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        merged: dict[str, Any] = {}
        for payload in _payloads(b"".join(self._tail), stream=self._stream):
            merged.update({k: v for k, v in payload.items() if v})
        if merged:
            _set_reply(self._span, merged)
        if self.status >= 400:
            api = _api()
            self._span.set_status(api.Status(api.StatusCode.ERROR))
        self._span.end()


# A stream's span reads only its last events: the finish-reason chunk, the usage chunk, [DONE], and one
# spare. Parsing every chunk of the tail cost 17% of a traced proxy's CPU (py-spy): under load, or
# from a fast upstream, one read holds most of a stream.
TAIL_EVENTS = 4


def _payloads(tail: bytes, *, stream: bool) -> list[dict[str, Any]]:
    """The JSON objects at the end of the tail, oldest first: a whole JSON body, or the last
    `TAIL_EVENTS` complete `data:` events of a stream."""
    if not stream:
        try:
            whole = json.loads(tail)
        except ValueError:
            return []
        return [whole] if isinstance(whole, dict) else []
    found = []
    end = len(tail)
    for _ in range(TAIL_EVENTS):
        start = tail.rfind(b"\ndata: ", 0, end) + 1  # 0 when the event opens the tail (or none is left)
        event = tail[start:end].strip()
        end = start - 1
        if event.startswith(b"data: {"):
            try:
                found.append(json.loads(event[6:]))
            except ValueError:
                pass  # the first event of the tail may be cut
        if end < 0:
            break
    found.reverse()
    return found


# ---- a finished request on its span (server/observe/finish.py's finish_request calls `record_request`) ----


def step_label(step: Step) -> str | None:
    """faithful | unfaithful | fixed | residual | unchecked; None for a step no detector was asked about
    (a reasoning step, or any step under detector `none`: there was no check to report)."""
    first = step.first_verdict
    if step.unchecked_reason == "detector_none":
        return None
    if step.unchecked_reason:
        return "unchecked"
    if first is None:
        return None
    if step.original_text is not None and not step.residual:
        return "fixed"
    if step.residual:
        return "residual"
    return "unfaithful" if first.unfaithful else "faithful"


def record_request(trace_record: RequestTrace) -> None:
    """The request's attributes and one evaluation event per checked step, on the current span (the
    request's SERVER span); nothing when no span is recording. Without OpenTelemetry loaded in this
    process (no OTEL_* variables, nobody else tracing) no span can be recording, and nothing is imported."""
    if "opentelemetry.trace" not in sys.modules:
        return
    span = _api().trace.get_current_span()
    if not span.is_recording():
        return
    admitted = trace_record.admitted
    span.set_attributes(
        {
            "gen_ai.request.model": str(admitted.body.get("model", "")),
            "faithproxy.request_id": admitted.request_id,
            "faithproxy.mode": admitted.policy.mode,
            "faithproxy.detector": admitted.policy.detector,
            "faithproxy.key_policy": admitted.key_policy,
        }
    )
    if trace_record.usage:
        usage = trace_record.usage
        span.set_attributes(
            {
                "gen_ai.usage.input_tokens": int(usage.get("prompt_tokens") or 0),
                "gen_ai.usage.output_tokens": int(usage.get("completion_tokens") or 0),
            }
        )
    for step in trace_record.steps:
        label = step_label(step)
        if label is None:
            continue
        first = step.first_verdict
        attributes: dict[str, Any] = {
            "gen_ai.evaluation.name": "faithfulness",
            "gen_ai.evaluation.score.label": label,
            "faithproxy.step.index": step.index,
            "faithproxy.step.kind": step.kind.value,
        }
        if first is not None and first.reason:
            attributes["gen_ai.evaluation.explanation"] = first.reason
        if first is not None and first.faithfulness is not Faithfulness.UNKNOWN and first.score is not None:
            attributes["gen_ai.evaluation.score.value"] = first.score
        span.add_event(EVALUATION_EVENT, attributes)
