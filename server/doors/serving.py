"""DoorServing: serves one admitted request at any door, in the door's API.

It owns what every door shares, once: off mode (the router's `Passthrough`, for a mode header the off
middleware does not read as `off`), the request view and the chain session, the accounting (metrics, the
trace record, the report) and the shape of a response: an SSE stream, a JSON body, or an error. What
differs between doors is only how the machine's emits are written, which the door's renderer does
(`Door.renderer`, server/protocol/render.py), and the door's round wire and messages (its `Door`).

Errors before the first byte are HTTP errors; after it, the renderer's error frame and its `done`.
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

from fastapi.responses import Response

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
from faithproxy.server.protocol.errors import error_response
from faithproxy.server.protocol.render import Answer, Ending, Renderer, Reply
from faithproxy.server.protocol.sse import FramesResponse
from faithproxy.server.state import AppState

log = logging.getLogger("faithproxy")


class DoorServing:
    """Serves one admitted request (see the module's docstring); every door's route hands it here."""

    def __init__(self, state: AppState, admitted: Admitted) -> None:
        self.state = state
        self.admitted = admitted
        self.door = state.doors[admitted.endpoint]
        self.policy = admitted.policy
        self.body = admitted.body  # what the chain drives vLLM with: a translated door's chat body
        self.stream = admitted.stream
        self.request_id = admitted.request_id
        self.started = admitted.started
        self.ttft: float | None = None
        self.error: FaithproxyError | None = None
        self.disconnected = False
        self.session: ChainSession | None = None
        # what was sent, by chat field (the trace's answer and reasoning), in the pieces it was sent in:
        # joined once at the end, where adding each token to a string would copy the whole text so far
        # each time (quadratic: 0.18 s of CPU for a 32,000-token chain)
        self._sent: dict[str, list[str]] = {}
        self.hints: dict[str, Any] | None = None  # what the hint stage did, for the trace
        self._finished = False

    @property
    def headers(self) -> dict[str, str]:
        return {"x-faithproxy-request-id": self.request_id, "x-faithproxy-mode": self.policy.mode}

    async def respond(self) -> Response:
        if self.policy.mode == "off":
            # Off-mode requests mostly never reach the router (server/doors/off.py serves them as pure
            # ASGI); those that do (a mode header the middleware does not read as `off`) get the same code.
            return Passthrough(self.state, self.admitted, self.door)
        if self.policy.hints and not self.door.hints:
            raise PolicyError(f"X-Faithproxy-Hints is not supported on {self.door.path}", param="x-faithproxy-hints")
        if (self.body.get("n") or 1) != 1:
            raise PolicyError("n > 1 is only supported with X-Faithproxy-Mode: off", param="n")
        messages = self.door.messages(self.body)  # what detectors, judges and the regenerator read
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
            wire=self.door.round_wire or CHAT_WIRE,
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
        request = self.admitted.request or self.body  # the client's body, in the door's API
        renderer = self.door.renderer(Reply(self.request_id, self.body["model"], self.admitted.started_wall, request))
        if self.stream:
            stream = self._sse(renderer, first, events)
            return FramesResponse(stream, media_type=renderer.media_type, headers=self.headers)
        return await self._collect(renderer, first, events)

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

    async def _sse(
        self, renderer: Renderer, first: list[Emit], events: AsyncIterator[list[Emit]]
    ) -> AsyncIterator[bytes]:
        """The stream: the frames of one batch of emits (what one upstream read brought) as one write."""
        try:
            batch: list[Emit] | None = first
            while batch is not None:
                frames = [data for item in batch for data in self._frames_for(renderer, item)]
                if frames:
                    if self.ttft is None:
                        self.ttft = time.perf_counter() - self.started
                        self.state.metrics.ttft.labels(self.policy.mode, self.admitted.endpoint).observe(self.ttft)
                    yield frames[0] if len(frames) == 1 else b"".join(frames)
                batch = await anext(events, None)
            stream_options = self.body.get("stream_options") or {}
            if isinstance(stream_options, dict) and stream_options.get("include_usage"):
                usage = renderer.usage(self._ending())
                if usage:
                    yield b"".join(usage)
            yield renderer.done
        except FaithproxyError as exc:
            self.error = exc
            yield renderer.error(exc)
            yield renderer.done
        except (asyncio.CancelledError, GeneratorExit):
            self.disconnected = True
            self.state.metrics.client_disconnects.inc()
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must still end the stream well-formed
            log.exception("internal error in stream %s", self.request_id)
            self.state.metrics.internal_errors.labels(self.admitted.endpoint).inc()
            self.error = FaithproxyError(f"internal error: {type(exc).__name__}")
            yield renderer.error(self.error)
            yield renderer.done
        finally:
            await _aclose(events)
            self._finish()

    def _frames_for(self, renderer: Renderer, item: Emit) -> list[bytes]:
        """One emit as the door's frames."""
        if isinstance(item, EmitText):
            self._sent.setdefault(item.field, []).append(item.text)
            step = step_annotation(item.step) if self.policy.annotate and item.step else None
            return renderer.text(item, step)
        if isinstance(item, EmitVerdicts):
            if not self.policy.annotate:
                return []
            return renderer.verdicts([step_annotation(s) for s in item.steps])
        if isinstance(item, EmitExtra):
            return renderer.extra(item)
        assert isinstance(item, EmitEnd)
        return renderer.end(item.finish_reason, self._ending())

    # ---- non-stream ---------------------------------------------------------------------------

    async def _collect(self, renderer: Renderer, first: list[Emit], events: AsyncIterator[list[Emit]]) -> Response:
        assert self.session is not None
        finish_reason: str | None = None
        extras: dict[str, Any] = {}
        try:
            batch: list[Emit] | None = first
            while batch is not None:
                for item in batch:
                    if isinstance(item, EmitText):
                        self._sent.setdefault(item.field, []).append(item.text)
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
        body = renderer.body(Answer(self.answer(), extras, finish_reason), self._ending())
        return Response(body.__pydantic_serializer__.to_json(body), media_type="application/json", headers=headers)

    def answer(self) -> dict[str, str]:
        """What was sent so far, by chat field (`content`, `reasoning`, `reasoning_content`)."""
        return {name: "".join(pieces) for name, pieces in self._sent.items()}

    # ---- accounting ---------------------------------------------------------------------------

    def _ending(self) -> Ending:
        """What the request spent and found so far, for the renderer's last word."""
        assert self.session is not None
        usage = dict(self.session.result().usage)
        return Ending(usage, {JUDGE_USAGE: judge_bill(self.session.view.judge_state)}, self._summary())

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
        if self._finished:
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
        answer = self.answer()
        return dataclasses.replace(
            trace,
            question=s.view.question,
            image_hashes=[i.sha256 for i in s.view.images],
            steps=s.steps,
            answer=answer.get("content", ""),
            reasoning=answer.get("reasoning") or answer.get("reasoning_content"),
            summary=self._summary(),
            usage=dict(s.result().usage),
            judge_usage=s.view.judge_state.summary(),
            verification_s=s.verification_s,
        )


async def _aclose(events: AsyncIterator[Any]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()
