"""ChainSession: the self-reflection loop of the paper's Algorithm 2, run on a live stream.

correct mode, per round (one upstream stream):
  1. a RoundReader task streams from vLLM and segments text into steps, running ahead;
  2. the session takes every step completed so far as one batch, sends it to the detector (one call),
     and meanwhile the reader keeps decoding the next steps;
  3. faithful (or reasoning) steps are emitted to the client in order; at the first unfaithful step the
     reader is cancelled (vLLM aborts), the read-ahead is dropped, the step is regenerated up to K
     times (each candidate re-checked), and a new round continues decoding from the accepted text with
     continue_final_message=true.
  After K failed tries the ORIGINAL step is kept (it is the model's own text; the candidates were no
  better by the detector's standard), marked residual, and decoding continues after it.

detect mode streams upstream text at once and sends verdicts in later chunks; it never rewrites.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from faithproxy.clients.vllm import VLLMClient
from faithproxy.detectors.base import Detector
from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.errors import DetectorError, FaithproxyError, RegenerationError
from faithproxy.faithcore.types import Channel, Faithfulness, Step, StepKind, Verdict
from faithproxy.regenerators.base import Regenerator
from faithproxy.server.metrics import Metrics, detector_error_label
from faithproxy.server.policy import RequestPolicy
from faithproxy.server.reader import ExtraDelta, Item, RoundEnd, RoundFailed, RoundReader, TextDelta, TrailingRaw
from faithproxy.server.settings import Settings

# ---- what the session hands to the response layer ----------------------------------------------


@dataclass
class EmitText:
    """Text for the client: a whole verified step (correct mode) or a raw delta (detect mode)."""

    channel: Channel
    field: str
    text: str
    step: Step | None = None  # the step this text completes, for its annotation


@dataclass
class EmitExtra:
    delta: dict[str, Any]


@dataclass
class EmitVerdicts:
    """detect mode: verdicts for steps whose text was already sent."""

    steps: list[Step]


@dataclass
class EmitEnd:
    finish_reason: str | None


Emit = EmitText | EmitExtra | EmitVerdicts | EmitEnd


@dataclass
class SessionStats:
    verification_s: float = 0.0
    regenerations: int = 0  # regeneration tries over the whole request
    rounds: int = 0
    upstream_id: str | None = None


@dataclass
class ChainSession:
    settings: Settings
    policy: RequestPolicy
    ctx: ChainContext
    generator: VLLMClient
    detector: Detector
    regenerator: Regenerator
    metrics: Metrics
    body: dict[str, Any]  # the client's body, unknown fields included, forwarded to vLLM
    model_label: str = "other"
    hidden_states: Any = None  # a HiddenStatesClient when features are recorded for traces
    steps: list[Step] = field(default_factory=list)  # every step emitted, in order
    stats: SessionStats = field(default_factory=SessionStats)
    field_names: dict[Channel, str] = field(default_factory=dict)
    _accepted_raw: dict[Channel, str] = field(default_factory=lambda: {Channel.REASONING: "", Channel.CONTENT: ""})
    _completion_budget: int | None = None
    _completion_used: int = 0

    def __post_init__(self) -> None:
        limit = self.body.get("max_completion_tokens") or self.body.get("max_tokens")
        self._completion_budget = int(limit) if isinstance(limit, int) else None

    # ---- public -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[Emit]:
        if self.policy.mode == "detect":
            async for item in self._run_detect():
                yield item
        else:
            async for item in self._run_correct():
                yield item

    # ---- upstream bodies ----------------------------------------------------------------------

    def _round_body(self) -> dict[str, Any] | None:
        """The body of the next round, or None when the completion budget is spent."""
        body = {k: v for k, v in self.body.items() if k not in ("stream", "stream_options")}
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # usage of every round is added up
        if self.stats.rounds == 0:
            return body
        partial = self._partial_assistant_text()
        body["messages"] = [*self.body["messages"], {"role": "assistant", "content": partial}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
        if self._completion_budget is not None:
            remaining = self._completion_budget - self._completion_used
            if remaining <= 0:
                return None
            key = "max_completion_tokens" if "max_completion_tokens" in self.body else "max_tokens"
            body[key] = remaining
        return body

    def _partial_assistant_text(self) -> str:
        """The accepted chain as the assistant's partial message.

        When vLLM's reasoning parser moved the thinking into `reasoning`, the tags were stripped: put the
        `<think>` block back and keep it open, so the model continues thinking instead of answering.
        """
        reasoning = self._accepted_raw[Channel.REASONING]
        content = self._accepted_raw[Channel.CONTENT]
        if not reasoning:
            return content
        text = self.settings.think_open_tag + reasoning
        if content:
            text += self.settings.think_close_tag + content
        return text

    # ---- correct mode -------------------------------------------------------------------------

    async def _run_correct(self) -> AsyncIterator[Emit]:
        while True:
            body = self._round_body()
            if body is None:
                yield EmitEnd("length")
                return
            self.stats.rounds += 1
            reader = RoundReader(self.generator, body, first_index=len(self.steps))
            task = asyncio.create_task(reader.run())
            try:
                outcome: list[Any] = []
                async for item in self._consume_round(reader, outcome):
                    yield item
            finally:
                await _cancel(task)
                self.field_names.update(reader.field_names)
            if outcome and isinstance(outcome[0], RoundEnd):
                yield EmitEnd(outcome[0].finish_reason)
                return
            # otherwise a step was corrected: continue decoding from the accepted prefix

    async def _consume_round(self, reader: RoundReader, outcome: list[Any]) -> AsyncIterator[Emit]:
        """Emits verified items of one round; appends the RoundEnd to `outcome` when the model stopped,
        and returns without it when a correction needs a new round."""
        pending: list[Item] = []
        ended: RoundEnd | None = None
        failure: RoundFailed | None = None
        while True:
            if not pending and ended is None and failure is None:
                pending.append(await reader.queue.get())
            while not reader.queue.empty():
                pending.append(reader.queue.get_nowait())
            # Items before a failure are still delivered (whole steps only); the error comes after them.
            failure = failure or next((i for i in pending if isinstance(i, RoundFailed)), None)
            if failure is not None and failure in pending:
                del pending[pending.index(failure) :]
            ended = ended or self._take_end(pending)
            if not pending:
                if failure is not None:
                    raise _as_faithproxy_error(failure.error)
                if ended is not None:
                    outcome.append(ended)
                    return
                continue
            batch = self._next_batch(pending)
            del pending[: len(batch)]
            sequential_stop = not self.settings.pipelined and ended is None and any(isinstance(i, Step) for i in batch)
            new_steps = [i for i in batch if isinstance(i, Step)]
            failed_at = await self._verify(new_steps)
            for item in batch:
                if isinstance(item, Step) and item is failed_at:
                    if not self._can_regenerate():
                        self._mark_residual(item, "not_corrected")
                        yield self._accept(item)
                        continue
                    # The read-ahead is dropped: the caller's finally cancels the reader, which closes
                    # the upstream stream (vLLM aborts that generation).
                    if ended is None:  # an aborted round reports no usage: estimate its tokens
                        self._completion_used += reader.deltas_seen
                        self.ctx.usage.completion_tokens += reader.deltas_seen
                    yield await self._correct(item)
                    return
                emitted = self._emit_item(item)
                if emitted is not None:
                    yield emitted
            if sequential_stop:
                # Sequential variant: stop decoding after each checked step, continue in a new request.
                self._completion_used += reader.deltas_seen
                self.ctx.usage.completion_tokens += reader.deltas_seen
                return

    def _take_end(self, pending: list[Item]) -> RoundEnd | None:
        ends = [i for i in pending if isinstance(i, RoundEnd)]
        if not ends:
            return None
        pending.remove(ends[0])
        end = ends[0]
        self.ctx.usage.add(end.usage)
        if end.usage:
            self._completion_used += int(end.usage.get("completion_tokens") or 0)
        if end.first_chunk and self.stats.upstream_id is None:
            self.stats.upstream_id = end.first_chunk.get("id")
        return end

    def _next_batch(self, pending: list[Item]) -> list[Item]:
        """Everything pending, up to max_batch_steps steps: one detector call for all of it."""
        batch: list[Item] = []
        steps = 0
        limit = self.settings.max_batch_steps if self.settings.pipelined else 1
        for item in pending:
            if isinstance(item, Step):
                if steps == limit:
                    break
                steps += 1
            batch.append(item)
        return batch

    def _emit_item(self, item: Item) -> Emit | None:
        if isinstance(item, Step):
            return self._accept(item)
        if isinstance(item, TrailingRaw):
            self._accepted_raw[item.channel] += item.raw
            return EmitText(item.channel, self._field(item.channel), item.raw)
        if isinstance(item, ExtraDelta):
            return EmitExtra(item.delta)
        return None  # TextDelta: correct mode sends whole steps instead

    def _accept(self, step: Step) -> EmitText:
        self._accepted_raw[step.channel] += step.raw
        step.index = len(self.steps)
        self.steps.append(step)
        self.ctx.accepted.append(step)
        self._count_step(step)
        return EmitText(step.channel, self._field(step.channel), step.raw, step)

    def _field(self, channel: Channel) -> str:
        return self.field_names.get(channel) or ("content" if channel is Channel.CONTENT else "reasoning")

    # ---- verification -------------------------------------------------------------------------

    async def _verify(self, new_steps: list[Step]) -> Step | None:
        """Sets verdicts on `new_steps`; returns the first unfaithful perception step, if any."""
        if not new_steps:
            return None  # a batch of trailing whitespace or tool-call deltas: nothing to check
        if not self.detector.types_steps and not any(s.kind is StepKind.PERCEPTION for s in new_steps):
            return None  # nothing this detector would look at
        if self.hidden_states is not None and self.policy.detector not in ("probe", "cascade"):
            # features for the trace, read while the detector works (probe and cascade read their own)
            from faithproxy.detectors.probe import record_features

            verdicts, _ = await asyncio.gather(
                self._check(new_steps), record_features(self.hidden_states, self.ctx, new_steps)
            )
        else:
            verdicts = await self._check(new_steps)
        if verdicts is None:
            return None
        for step, verdict in zip(new_steps, verdicts, strict=True):
            if verdict.kind is not None:
                step.kind = verdict.kind  # the judge's typing is better than the keyword heuristic
            step.verdict = step.first_verdict = verdict
            if verdict.faithfulness is Faithfulness.UNKNOWN and step.kind is StepKind.PERCEPTION:
                step.unchecked_reason = step.unchecked_reason or self._unknown_reason()
        for step in new_steps:
            if step.kind is StepKind.PERCEPTION and step.verdict is not None and step.verdict.unfaithful:
                return step
        return None

    def _unknown_reason(self) -> str:
        return "detector_none" if self.policy.detector == "none" else "detector_error"

    async def _check(self, steps: list[Step]) -> list[Verdict] | None:
        """One detector call; None when it failed and the policy says to pass the steps unchecked."""
        name = self.policy.detector
        started = time.perf_counter()
        try:
            verdicts = await self.detector.check(self.ctx, steps)
            if len(verdicts) != len(steps):
                raise DetectorError(f"detector {name} returned {len(verdicts)} verdicts for {len(steps)} steps")
        except DetectorError as exc:
            self.metrics.detector_errors.labels(name, detector_error_label(exc)).inc()
            if self.policy.on_detector_error == "fail":
                raise
            for step in steps:
                step.verdict = step.first_verdict = Verdict(Faithfulness.UNKNOWN, name, reason=exc.message)
                step.unchecked_reason = "detector_error"
            return None
        finally:
            elapsed = time.perf_counter() - started
            self.stats.verification_s += elapsed
            self.metrics.detector_latency.labels(name).observe(elapsed)
            self.metrics.detector_batch.labels(name).observe(len(steps))
        return verdicts

    # ---- correction ---------------------------------------------------------------------------

    def _can_regenerate(self) -> bool:
        return (
            self.policy.mode == "correct"
            and self.policy.max_retries > 0
            and self.stats.regenerations < self.settings.max_regenerations_per_request
        )

    async def _correct(self, step: Step) -> EmitText:
        """Regenerates `step` (≤ K tries, each re-checked) and accepts the result."""
        prefix = [s.text for s in self.steps]
        started = time.perf_counter()
        fixed: str | None = None
        for attempt in range(1, self.policy.max_retries + 1):
            if self.stats.regenerations >= self.settings.max_regenerations_per_request:
                break
            self.stats.regenerations += 1
            step.attempts = attempt
            try:
                candidate = await self.regenerator.regenerate(self.ctx, prefix, step, attempt)
            except RegenerationError:
                self.metrics.regeneration_attempts.labels("error").inc()
                continue
            if candidate is None:
                self.metrics.regeneration_attempts.labels("unparseable").inc()
                continue
            trial = Step(index=step.index, text=candidate, raw=candidate, channel=step.channel, kind=step.kind)
            verdicts = await self._check([trial])
            if verdicts is not None and verdicts[0].unfaithful:
                step.rejected.append(candidate)
                self.metrics.regeneration_attempts.labels("still_unfaithful").inc()
                continue
            self.metrics.regeneration_attempts.labels("fixed").inc()
            fixed = candidate
            step.verdict = verdicts[0] if verdicts is not None else trial.verdict
            if verdicts is None:
                step.unchecked_reason = "detector_error"
            break
        self.stats.verification_s += time.perf_counter() - started
        if fixed is not None:
            step.original_text = step.text
            step.raw = _leading(step.raw, step.text) + fixed
            step.text = fixed
            self.metrics.regeneration_outcomes.labels("fixed", str(step.attempts)).inc()
            if step.unchecked_reason:
                self._mark_residual(step, "unchecked")
        else:
            self.metrics.regeneration_outcomes.labels("failed", str(step.attempts)).inc()
            self._mark_residual(step, "regeneration_failed")
        return self._accept(step)

    def _mark_residual(self, step: Step, reason: str) -> None:
        step.residual = True
        step.residual_reason = reason

    # ---- detect mode --------------------------------------------------------------------------

    async def _run_detect(self) -> AsyncIterator[Emit]:
        body = self._round_body()
        assert body is not None
        self.stats.rounds = 1
        reader = RoundReader(self.generator, body, first_index=0)
        read_task = asyncio.create_task(reader.run())
        to_check: list[Step] = []
        check_task: asyncio.Task[Step | None] | None = None
        checking: list[Step] = []
        ended: RoundEnd | None = None
        get_task: asyncio.Task[Item] | None = None
        try:
            while True:
                if check_task is None and to_check:
                    limit = self.settings.max_batch_steps
                    checking, to_check = to_check[:limit], to_check[limit:]
                    check_task = asyncio.create_task(self._verify(checking))
                if ended is not None and check_task is None and not to_check:
                    break
                waits: set[asyncio.Task[Any]] = set()
                if ended is None:
                    get_task = get_task or asyncio.create_task(reader.queue.get())
                    waits.add(get_task)
                if check_task is not None:
                    waits.add(check_task)
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if check_task is not None and check_task in done:
                    check_task.result()  # re-raises a DetectorError under on-detector-error=fail
                    check_task = None
                    for step in checking:
                        if step.kind is StepKind.PERCEPTION and step.verdict is not None and step.verdict.unfaithful:
                            self._mark_residual(step, "not_corrected")
                        self._count_step(step)
                    self.ctx.accepted.extend(checking)
                    yield EmitVerdicts(list(checking))
                    checking = []
                if get_task is not None and get_task in done:
                    item = get_task.result()
                    get_task = None
                    if isinstance(item, RoundFailed):
                        raise _as_faithproxy_error(item.error)
                    if isinstance(item, RoundEnd):
                        ended = self._take_end([item])
                    elif isinstance(item, TextDelta):
                        self.field_names.setdefault(item.channel, item.field)
                        self._accepted_raw[item.channel] += item.text
                        yield EmitText(item.channel, item.field, item.text)
                    elif isinstance(item, ExtraDelta):
                        yield EmitExtra(item.delta)
                    elif isinstance(item, Step):
                        item.index = len(self.steps)
                        self.steps.append(item)
                        to_check.append(item)
            yield EmitEnd(ended.finish_reason if ended else None)
        finally:
            for task in (get_task, check_task, read_task):
                if task is not None:
                    await _cancel(task)

    # ---- accounting ---------------------------------------------------------------------------

    def _count_step(self, step: Step) -> None:
        verdict = step.first_verdict.faithfulness.value if step.first_verdict else Faithfulness.UNKNOWN.value
        detector = self.policy.detector
        self.metrics.steps.labels(step.kind.value, verdict, detector, self.model_label).inc()
        if step.kind is not StepKind.PERCEPTION:
            return
        if verdict == Faithfulness.UNKNOWN.value:
            step.unchecked_reason = step.unchecked_reason or self._unknown_reason()
            self.metrics.unchecked.labels(detector, self.model_label, step.unchecked_reason).inc()
            if not step.residual:
                self._mark_residual(step, "unchecked")
        if step.residual:
            self.metrics.residual.labels(detector, self.model_label, step.residual_reason or "unchecked").inc()


def _leading(raw: str, text: str) -> str:
    """The whitespace/tags before a step's text inside its raw span."""
    at = raw.rfind(text)
    return raw[:at] if at >= 0 else raw[: len(raw) - len(raw.lstrip())]


def _as_faithproxy_error(exc: BaseException) -> FaithproxyError:
    if isinstance(exc, FaithproxyError):
        return exc
    return FaithproxyError(f"internal error while reading upstream: {type(exc).__name__}")


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancels `task` and waits for it to finish its cleanup (closing the upstream response).

    asyncio.wait, not `await task`: when the session is itself being cancelled (the client went away),
    awaiting the task would cancel it a second time in the middle of its cleanup and leave the upstream
    connection open, so vLLM would never see the abort. The cancellation of the session still propagates.
    """
    if not task.done():
        task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: a failed task's error was already handed over as an item
