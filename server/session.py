"""ChainSession: the async driver around the correction core.

The core (server/correction.py) decides everything: what reaches the client, which batch is checked,
which step is regenerated, when a round starts, is dropped or ends, and each step's outcome. The session
only does what it asks — reads upstream rounds (server/reader.py, a task running ahead of the checks),
calls the detector and the regenerator — hands the results back, and counts what the core decided.

correct mode awaits each check and rewrite in turn while the round reads on in its own task. detect
mode runs the reader (producer) and a checker (consumer) side by side in one TaskGroup: text goes out
as it arrives, verdicts follow as each batch is checked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from faithproxy.clients.vllm import VLLMClient
from faithproxy.detectors.base import Detector
from faithproxy.detectors.probe import REASONING_FORMAT_OPTION
from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.errors import DetectorError, RegenerationError
from faithproxy.faithcore.reasoning_formats import get_format
from faithproxy.faithcore.types import Channel, Faithfulness, Step, StepKind
from faithproxy.regenerators.base import Regenerator
from faithproxy.server.correction import (
    WAIT,
    Action,
    Check,
    Checked,
    CorrectionCore,
    DropRound,
    Emit,
    EmitEnd,
    EmitExtra,
    EmitText,
    EmitVerdicts,
    Fail,
    Regenerate,
    Regenerated,
    Rules,
    SessionStats,
    StartRound,
    Tried,
)
from faithproxy.server.metrics import Metrics, detector_error_label
from faithproxy.server.policy import RequestPolicy
from faithproxy.server.reader import ItemQueue, RoundReader, TextDelta
from faithproxy.server.settings import Settings

__all__ = ["ChainSession", "Emit", "EmitEnd", "EmitExtra", "EmitText", "EmitVerdicts", "SessionStats"]


@dataclass
class ChainSession:
    # The core's class: the performance benchmark swaps in its strictly sequential variant.
    core_class: ClassVar[type[CorrectionCore]] = CorrectionCore

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
    steps: list[Step] = field(default_factory=list)  # every step emitted, in order (the core fills it)
    stats: SessionStats = field(default_factory=SessionStats)
    field_names: dict[Channel, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        settings = self.settings
        self.reasoning_format = get_format(
            self.policy.reasoning_format or settings.reasoning_format, settings.think_open_tag, settings.think_close_tag
        )
        # hidden-state captures render the chain with the think markers the model saw (detectors/probe.py)
        self.ctx.options[REASONING_FORMAT_OPTION] = self.reasoning_format
        # `include_reasoning: false` asks vLLM to leave the thinking out of the response. The proxy still
        # reads (and checks, and corrects) it, since the answer is written from it: it is dropped on the
        # way out instead.
        self.hide_reasoning = self.body.get("include_reasoning") is False
        limit = self.body.get("max_completion_tokens") or self.body.get("max_tokens")
        rules = Rules(
            mode="detect" if self.policy.mode == "detect" else "correct",
            detector=self.policy.detector,
            max_retries=self.policy.max_retries,
            max_regenerations=self.settings.max_regenerations_per_request,
            max_batch_steps=self.settings.max_batch_steps,
            on_detector_error=self.policy.on_detector_error,
            detector_checks=self.detector.checks,
            detector_types_steps=self.detector.types_steps,
            gate_without_perception=not self.settings.judge_every_step,
            completion_budget=limit if isinstance(limit, int) else None,
            reasoning_format=self.reasoning_format,
        )
        self.core = self.core_class(rules, self.ctx, steps=self.steps, stats=self.stats, field_names=self.field_names)

    async def run(self) -> AsyncIterator[Emit]:
        """Performs the core's actions until it ends; a failure is raised after what was emitted."""
        core, detect = self.core, self.policy.mode == "detect"
        checks: asyncio.Queue[Check] = asyncio.Queue()  # detect mode: work for the checker
        reader: RoundReader | None = None
        task: asyncio.Task[None] | None = None
        try:
            while True:
                action = core.next_action()
                if action is WAIT:  # the round's next item (in detect mode: or a check's result)
                    assert reader is not None
                    core.receive(await reader.queue.get())
                    if not detect:  # everything read so far goes into the next batch
                        self._receive_ready(reader)
                elif isinstance(action, StartRound):
                    reader = RoundReader(
                        self.generator,
                        self._round_body(action),
                        first_index=len(self.steps),
                        # correct mode: a text delta is only counted by the core, so it wakes nobody; the
                        # session takes it with the next item that does (server/reader.py, ItemQueue).
                        queue=ItemQueue(quiet=() if detect else (TextDelta,)),
                        tags=self.reasoning_format.tags,
                        in_answer=action.continuation is not None and action.continuation.in_answer,
                    )
                    task = asyncio.create_task(self._read(reader, checks if detect else None))
                elif isinstance(action, DropRound):
                    assert task is not None
                    await _cancel(task)  # closes the upstream stream: vLLM aborts, the read-ahead goes
                    reader = task = None
                elif isinstance(action, Check) and detect:
                    checks.put_nowait(action)
                elif isinstance(action, Check):
                    checked = await self._verify(action)
                    if reader is not None:  # what the round read meanwhile (its end, perhaps) comes first
                        self._receive_ready(reader)
                    core.receive(checked)
                elif isinstance(action, Regenerate):
                    core.receive(await self._regenerate(action))
                elif isinstance(action, Fail):
                    raise action.error
                elif isinstance(action, Tried):
                    self._count(action)
                else:
                    self._count(action)
                    if self.hide_reasoning and isinstance(action, EmitText) and action.channel is Channel.REASONING:
                        continue  # counted, not sent: the client asked for no reasoning
                    yield action
                    if isinstance(action, EmitEnd):
                        return
        finally:
            if task is not None:
                await _cancel(task)

    # ---- the I/O the core asks for ------------------------------------------------------------

    async def _read(self, reader: RoundReader, checks: asyncio.Queue[Check] | None) -> None:
        """One round: the reader alone, or (detect mode) the reader as producer and a checker as consumer
        in one TaskGroup. The checker posts its results into the reader's queue: the session waits on one
        queue for whichever comes first."""
        if checks is None:
            await reader.run()
            return
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(reader.run())
            tasks.create_task(self._checker(checks, reader.queue))

    async def _checker(self, checks: asyncio.Queue[Check], results: ItemQueue) -> None:
        while True:
            check = await checks.get()
            try:
                result = await self._verify(check)
            except Exception as exc:  # a bug in a detector: the core fails the request with it
                result = Checked(error=exc)
            results.put_nowait(result)

    def _receive_ready(self, reader: RoundReader) -> None:
        while not reader.queue.empty():
            self.core.receive(reader.queue.get_nowait())

    async def _verify(self, check: Check) -> Checked:
        """The detector's verdicts; the trace's hidden-state features are read beside them when the
        server records features and the detector does not read its own (new steps only, not rewrites)."""
        if self.hidden_states is None or self.detector.reads_hidden_states or check.candidate:
            return await self._check(check)
        from faithproxy.detectors.probe import record_features

        checked, _ = await asyncio.gather(
            self._check(check), record_features(self.hidden_states, self.ctx, check.steps)
        )
        return checked

    async def _check(self, check: Check) -> Checked:
        """One detector call; a DetectorError is its result (counted here, judged by the core)."""
        name = self.policy.detector
        started = time.perf_counter()
        try:
            verdicts = await self.detector.check(self.ctx, check.steps)
            if len(verdicts) != len(check.steps):
                raise DetectorError(f"detector {name} returned {len(verdicts)} verdicts for {len(check.steps)} steps")
            return Checked(verdicts)
        except DetectorError as exc:
            self.metrics.detector_errors.labels(name, detector_error_label(exc)).inc()
            return Checked(error=exc)
        finally:
            elapsed = time.perf_counter() - started
            self.stats.verification_s += elapsed
            self.metrics.detector_latency.labels(name).observe(elapsed)
            self.metrics.detector_batch.labels(name).observe(len(check.steps))

    async def _regenerate(self, action: Regenerate) -> Regenerated:
        started = time.perf_counter()
        try:
            candidate = await self.regenerator.regenerate(self.ctx, action.prefix, action.step, action.attempt)
            return Regenerated(candidate)
        except RegenerationError as exc:
            return Regenerated(error=exc)
        finally:
            self.stats.verification_s += time.perf_counter() - started

    def _round_body(self, start: StartRound) -> dict[str, Any]:
        body = {k: v for k, v in self.body.items() if k not in ("stream", "stream_options", "include_reasoning")}
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # usage of every round is added up
        if start.continuation is None:
            return body
        partial = start.continuation.content
        body["messages"] = [*self.body["messages"], {"role": "assistant", "content": partial}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
        if start.max_tokens is not None:
            body["max_completion_tokens" if "max_completion_tokens" in self.body else "max_tokens"] = start.max_tokens
        return body

    # ---- metrics: read what the core decided, never decide -------------------------------------

    def _count(self, action: Action) -> None:
        if isinstance(action, Tried):
            self.metrics.regeneration_attempts.labels(action.outcome).inc()
        elif isinstance(action, EmitText) and action.step is not None:
            self._count_step(action.step)
        elif isinstance(action, EmitVerdicts):
            for step in action.steps:
                self._count_step(step)

    def _count_step(self, step: Step) -> None:
        """Counts a step whose outcome the core has settled (it left the core)."""
        m, detector, model = self.metrics, self.policy.detector, self.model_label
        detected = step.first_verdict.faithfulness if step.first_verdict else Faithfulness.UNKNOWN
        m.steps.labels(step.kind.value, detected.value, detector, model).inc()
        if step.attempts:
            outcome = "fixed" if step.original_text is not None else "failed"
            m.regeneration_outcomes.labels(outcome, str(step.attempts)).inc()
        if step.unchecked_reason == "gated":
            m.gated_steps.labels(detector, model).inc()
        if step.kind is not StepKind.PERCEPTION:
            return
        if detected is Faithfulness.UNKNOWN:
            m.unchecked.labels(detector, model, step.unchecked_reason or "detector_error").inc()
        if step.residual:
            m.residual.labels(detector, model, step.residual_reason or "unchecked").inc()


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
