"""ChatServing: turns a ChainSession into an OpenAI response — SSE stream, JSON body, or pass-through.

Errors before the first byte are HTTP errors; after it, a final error frame and `data: [DONE]`.
Whatever happens (error, client gone), the trace record is written and the request is counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.errors import DetectorError, FaithproxyError, PolicyError
from faithproxy.faithcore.images import images_in_messages, last_user_text
from faithproxy.server.admission.admit import Admitted
from faithproxy.server.chain.hints import apply_hints, collect_hints
from faithproxy.server.chain.judge_bill import FIELD as JUDGE_USAGE
from faithproxy.server.chain.judge_bill import bill_header, judge_bill
from faithproxy.server.chain.session import CHAT_WIRE, ChainSession, Emit, EmitEnd, EmitExtra, EmitText, EmitVerdicts
from faithproxy.server.doors.off import Passthrough
from faithproxy.server.observe.finish import finish_request
from faithproxy.server.observe.reports import report
from faithproxy.server.observe.summary import step_annotation, summarize
from faithproxy.server.observe.traces import RequestTrace
from faithproxy.server.protocol.errors import error_frame, error_response
from faithproxy.server.protocol.sse import DONE, ChunkFactory, frame
from faithproxy.server.state import AppState

log = logging.getLogger("faithproxy")


class ChatServing:
    """Serves one admitted chat request. Another door (server/doors/completions.py, ...) subclasses it, giving
    its own `wire`, `_messages`, `_chunks`, frame hooks (`_text_frames`, `_verdict_frames`,
    `_extra_frames`, `_end_frames`) and `_body`: the session and accounting stay here."""

    wire = CHAT_WIRE  # the rounds' path, body and wire reader (server/chain/session.py)
    object_id_prefix = "chatcmpl"
    done_frame = DONE  # what ends a stream: `data: [DONE]` on OpenAI's chat and completions APIs

    def __init__(self, state: AppState, admitted: Admitted) -> None:
        self.state = state
        self.admitted = admitted
        self.door = state.doors[admitted.endpoint]
        self.policy = admitted.policy
        self.body = admitted.body
        self.raw = admitted.raw
        self.stream = admitted.stream
        self.request_id = admitted.request_id
        self.started = admitted.started
        self.started_wall = admitted.started_wall
        self.ttft: float | None = None
        self.error: FaithproxyError | None = None
        self.disconnected = False
        self.session: ChainSession | None = None
        self.answer: dict[str, str] = {}
        self.hints: dict[str, Any] | None = None  # what the hint stage did, for the trace

    @property
    def headers(self) -> dict[str, str]:
        return {"x-faithproxy-request-id": self.request_id, "x-faithproxy-mode": self.policy.mode}

    async def respond(self) -> Response:
        if self.policy.mode == "off":
            return await self._passthrough()
        if (self.body.get("n") or 1) != 1:
            raise PolicyError("n > 1 is only supported with X-Faithproxy-Mode: off", param="n")
        messages = self._messages()
        images = images_in_messages(messages)  # PolicyError on a malformed image: nothing sent yet
        question = last_user_text(messages)  # the client's question: what judges are told was asked
        body = self.body
        if self.policy.hints:
            messages = await self._with_hints(messages, question)
            body = {**self.body, "messages": messages}
        detector = self.state.detectors[self.policy.detector]
        if detector.uses_judge and self.state.judge_fetches_images(self.policy.judge):
            assert self.state.image_fetcher is not None
            images = await self.state.image_fetcher.fetch_all(images)  # ImageRefused: nothing sent yet
        view = RequestView(
            request_id=self.request_id,
            model=self.body["model"],
            messages=messages,
            question=question,
            images=images,
            judge=self.policy.judge,
            options=self.policy.detector_options(),
        )
        # the judge's bill, call by call, by the API key policy's name
        count = self.state.metrics.count_judge_call
        view.judge_state.on_call = functools.partial(count, policy=self.admitted.key_policy)
        detector.validate_request(view)  # ProbeMismatch (409) before anything is sent upstream
        self.session = ChainSession(
            settings=self.state.settings,
            policy=self.policy,
            view=view,
            generator=self.state.generator,
            detector=detector,
            regenerator=self.state.regenerator,
            metrics=self.state.metrics,
            body=body,
            model_label=self.state.model_label(self.body["model"]),
            hidden_states=self.state.hidden_states,
            wire=self.wire,
        )
        self.state.metrics.in_flight.inc()
        events = self.session.run_batches().__aiter__()
        try:
            first = await events.__anext__()
        except StopAsyncIteration:
            first = [EmitEnd(None)]
        except FaithproxyError as exc:
            self.error = exc
            self._finish()
            return error_response(exc, headers=self.headers, door=self.door)
        except BaseException:
            self.error = FaithproxyError("request cancelled")
            self._finish()
            raise
        if self.stream:
            return StreamingResponse(self._sse(first, events), media_type="text/event-stream", headers=self.headers)
        return await self._collect(first, events)

    def _messages(self) -> list[dict[str, Any]]:
        """The conversation as chat messages: what detectors, judges and the regenerator read."""
        return self.body["messages"]

    async def _with_hints(self, messages: list[dict[str, Any]], question: str) -> list[dict[str, Any]]:
        """The messages with hints, or unchanged when the hint judge fails or gives none (counted)."""
        metrics = self.state.metrics
        started = time.perf_counter()
        try:
            hints, _, _ = await collect_hints(self.state.hint_llm, question)
        except DetectorError as exc:
            log.warning("hints for %s failed: %s", self.request_id, exc)
            metrics.hint_requests.labels("error").inc()
            self.hints = {"outcome": "error", "reason": exc.code}
            return messages
        finally:
            metrics.hint_latency.observe(time.perf_counter() - started)
        if hints is None:
            metrics.hint_requests.labels("unusable").inc()
            self.hints = {"outcome": "unusable"}
            return messages
        metrics.hint_requests.labels("applied").inc()
        self.hints = {"outcome": "applied", **dataclasses.asdict(hints)}
        return apply_hints(messages, hints)

    # ---- streams ------------------------------------------------------------------------------

    async def _sse(self, first: list[Emit], events: AsyncIterator[list[Emit]]) -> AsyncIterator[bytes]:
        """The stream: the frames of one batch of emits (what one upstream read brought) as one write."""
        assert self.session is not None
        chunks = self._chunks()
        try:
            batch: list[Emit] | None = first
            while batch is not None:
                frames = [data for item in batch for data in self._frames_for(item, chunks)]
                if frames:
                    if self.ttft is None:
                        self.ttft = time.perf_counter() - self.started
                        self.state.metrics.ttft.labels(self.policy.mode, self.admitted.endpoint).observe(self.ttft)
                    yield frames[0] if len(frames) == 1 else b"".join(frames)
                batch = await anext(events, None)
            stream_options = self.body.get("stream_options") or {}
            if isinstance(stream_options, dict) and stream_options.get("include_usage"):
                yield frame({**chunks.usage_chunk(dict(self.session.result().usage)), **self._judge_usage()})
            yield self.done_frame
        except FaithproxyError as exc:
            self.error = exc
            yield self._error_frame(exc)
            yield self.done_frame
        except (asyncio.CancelledError, GeneratorExit):
            self.disconnected = True
            self.state.metrics.client_disconnects.inc()
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must still end the stream well-formed
            log.exception("internal error in stream %s", self.request_id)
            self.state.metrics.internal_errors.labels(self.admitted.endpoint).inc()
            self.error = FaithproxyError(f"internal error: {type(exc).__name__}")
            yield self._error_frame(self.error)
            yield self.done_frame
        finally:
            await _aclose(events)
            self._finish()

    def _error_frame(self, exc: FaithproxyError) -> bytes:
        """The frame that ends a stream failed after its first byte (the door's own error format)."""
        return error_frame(exc)

    def _chunks(self) -> ChunkFactory:
        return ChunkFactory(f"{self.object_id_prefix}-{self.request_id}", self.body["model"])

    def _frames_for(self, item: Emit, chunks: ChunkFactory) -> list[bytes]:
        """One emit as the door's frames; each door renders the four kinds in its hooks below."""
        if isinstance(item, EmitText):
            self.answer[item.field] = self.answer.get(item.field, "") + item.text
            step = step_annotation(item.step) if self.policy.annotate and item.step else None
            return self._text_frames(item, step, chunks)
        if isinstance(item, EmitVerdicts):
            if not self.policy.annotate:
                return []
            return self._verdict_frames([step_annotation(s) for s in item.steps], chunks)
        if isinstance(item, EmitExtra):
            return self._extra_frames(item, chunks)
        assert isinstance(item, EmitEnd) and self.session is not None
        return self._end_frames(item, chunks)

    def _text_frames(self, item: EmitText, step: dict[str, Any] | None, chunks: ChunkFactory) -> list[bytes]:
        """`step`: the annotation of the step this text completes, when the client gets annotations."""
        if step is None:  # detect mode's per-token deltas: only the text is encoded
            return [chunks.text_frame(item.field, item.text)]
        return [frame(chunks.chunk({item.field: item.text}, extra={"faithfulness": {"step": step}}))]

    def _verdict_frames(self, verdicts: list[dict[str, Any]], chunks: ChunkFactory) -> list[bytes]:
        return [frame(chunks.chunk({}, extra={"faithfulness": {"verdicts": verdicts}}))]

    def _extra_frames(self, item: EmitExtra, chunks: ChunkFactory) -> list[bytes]:
        return [frame(chunks.chunk(item.delta))]

    def _end_frames(self, item: EmitEnd, chunks: ChunkFactory) -> list[bytes]:
        extra = {"faithfulness": self._summary(), **self._judge_usage()}
        return [frame(chunks.chunk({}, finish_reason=item.finish_reason or "stop", extra=extra))]

    # ---- non-stream ---------------------------------------------------------------------------

    async def _collect(self, first: list[Emit], events: AsyncIterator[list[Emit]]) -> Response:
        assert self.session is not None
        finish_reason: str | None = None
        extras: dict[str, Any] = {}
        try:
            batch: list[Emit] | None = first
            while batch is not None:
                for item in batch:
                    if isinstance(item, EmitText):
                        self.answer[item.field] = self.answer.get(item.field, "") + item.text
                    elif isinstance(item, EmitExtra):
                        extras.update(item.delta)
                    elif isinstance(item, EmitEnd):
                        finish_reason = item.finish_reason
                batch = await anext(events, None)
        except FaithproxyError as exc:
            self.error = exc
            return error_response(exc, headers=self.headers, door=self.door)
        finally:
            await _aclose(events)
            self._finish()
        headers = {**self.headers, **bill_header(judge_bill(self.session.view.judge_state))}
        return JSONResponse(self._body(finish_reason, extras), headers=headers)

    def _body(self, finish_reason: str | None, extras: dict[str, Any]) -> dict[str, Any]:
        """The non-streamed response from what the session emitted."""
        assert self.session is not None
        message: dict[str, Any] = {"role": "assistant", "content": self.answer.get("content"), **extras}
        for name in ("reasoning", "reasoning_content"):
            if name in self.answer:
                message[name] = self.answer[name]
        body = {
            "id": f"chatcmpl-{self.request_id}",
            "object": "chat.completion",
            "created": int(self.started_wall),
            "model": self.body["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason or "stop"}],
            "usage": dict(self.session.result().usage),
            **self._judge_usage(),
            "faithfulness": self._summary(),
        }
        return body

    # ---- off mode: the same bytes vLLM sent ---------------------------------------------------

    async def _passthrough(self) -> Response:
        """Off-mode requests mostly never reach the router (server/doors/off.py serves them as pure
        ASGI); those that do (a mode header the middleware does not read as `off`) get the same code."""
        return Passthrough(self.state, self.admitted, self.door)

    # ---- accounting ---------------------------------------------------------------------------

    def _judge_usage(self) -> dict[str, Any]:
        """The judge's bill beside `usage` (server/chain/judge_bill.py)."""
        assert self.session is not None
        return {JUDGE_USAGE: judge_bill(self.session.view.judge_state)}

    def _summary(self) -> dict[str, Any]:
        assert self.session is not None
        s = self.session
        result = s.result()
        return summarize(
            list(result.steps),
            mode=self.policy.mode,
            detector=self.policy.detector,
            regenerations=result.regenerations,
            verification_s=s.verification_s,
            rounds=result.rounds,
            judge=s.view.judge_state.summary(),
            resumes=result.resumes,
        )

    def _finish(self, status: int | None = None) -> None:
        """Counts the request and writes its trace: runs exactly once, whatever happened."""
        if getattr(self, "_finished", False):
            return
        self._finished = True
        metrics = self.state.metrics
        trace = self._trace(status or 200)
        if self.session is not None:
            metrics.in_flight.dec()
            metrics.verification_seconds.labels(self.policy.mode).inc(trace.verification_s)
        finish_request(trace, metrics, self.state.tracer)
        if trace.summary is not None and self.state.reports is not None:
            self.state.reports.put(self.request_id, self._report(trace))

    def _report(self, trace: RequestTrace) -> dict[str, Any]:
        """What GET /v1/faithfulness/{request_id} returns for this request (server/observe/reports.py)."""
        assert self.session is not None
        keep_images = self.state.settings.reports_keep_images
        return report(
            trace,
            outcome="disconnected" if self.disconnected else "failed" if self.error is not None else "completed",
            images=[
                {"sha256": i.sha256, **({"data_url": i.url} if keep_images and i.is_data_url else {})}
                for i in self.session.view.images
            ],
        )

    def _trace(self, status: int) -> RequestTrace:
        """The values server/observe/traces.py counts and writes: a session's only when one ran (its steps are
        final by now)."""
        trace = RequestTrace(self.admitted, status, self.ttft, self.error, self.disconnected, self.hints)
        s = self.session
        if s is None:
            return trace
        return dataclasses.replace(
            trace,
            question=s.view.question,
            image_hashes=[i.sha256 for i in s.view.images],
            steps=s.steps,
            answer=self.answer.get("content", ""),
            reasoning=self.answer.get("reasoning") or self.answer.get("reasoning_content"),
            summary=self._summary(),
            usage=dict(s.result().usage),
            judge_usage=s.view.judge_state.summary(),
            verification_s=s.verification_s,
        )


async def _aclose(events: AsyncIterator[Any]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()
