"""ChainSession: the async driver of the correction machine (faithcore/correction/).

The machine decides everything: what reaches the client, which batch is checked, which step is regenerated,
when a round starts, is dropped or ends, and each step's outcome. The session only does what it asks — runs
upstream rounds (server/chain/reader.py, a task feeding the machine ahead of the checks), calls the detector
and the regenerator with a frozen view of the request — hands the results back, and counts what the machine
decided.

correct mode awaits each check and rewrite in turn while the round reads on in its own task. detect mode runs
a checker task beside the rounds: text goes out as it arrives, verdicts follow as each batch is checked. Two
tasks feed the machine: the session (results of what it asked for, detect mode's verdicts too, which the
checker only hands over) and the reader (a round's deltas: it runs the segmenter as data arrives, so the
session is woken once per completed step, not once per read). A round whose stream broke is resumed when the
machine says so (a ResumeNote, then DropRound and StartRound like any continuation); the session counts it in
faithproxy_upstream_resumes_total.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from faithproxy.clients.vllm import CHAT_PATH, VLLMClient
from faithproxy.detectors.base import Detector
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.correction import (
    WAIT,
    ChainResult,
    Check,
    Checked,
    DropRound,
    Emit,
    EmitEnd,
    EmitExtra,
    EmitText,
    EmitVerdicts,
    Fail,
    Note,
    Regenerate,
    Regenerated,
    RegenerationNote,
    ResumeOutcome,
    StartRound,
    new_machine,
)
from faithproxy.faithcore.correction.wire import ChatChunkReader
from faithproxy.faithcore.errors import RegenerationError
from faithproxy.faithcore.types import Channel, Step
from faithproxy.regenerators.base import Regenerator
from faithproxy.server.admission.policy import RequestPolicy
from faithproxy.server.chain.reader import RoundReader
from faithproxy.server.chain.verify import chain_rules, reasoning_format_of, verify
from faithproxy.server.observe.metrics import Metrics
from faithproxy.server.observe.step_metrics import count_step
from faithproxy.server.protocol.wires import RoundWire
from faithproxy.server.settings import Settings

# Waits before resume attempt 1, 2, 3, ... (the last one repeats): a router needs a moment to notice a dead
# replica (vLLM's router, checking health every second: docs/replicas.md), and a resume round sent at
# once would be hashed to it again and refused.
RESUME_BACKOFF_S = (0.5, 1.0, 2.0)

_EMITS = (EmitText, EmitExtra, EmitVerdicts, EmitEnd)

__all__ = ["CHAT_WIRE", "ChainSession", "Emit", "EmitEnd", "EmitExtra", "EmitText", "EmitVerdicts"]


def chat_round_body(client_body: dict[str, Any], start: StartRound) -> dict[str, Any]:
    """A chat round: the client's body streamed; a continuation adds the accepted text as the partial
    assistant message that vLLM continues (`continue_final_message`)."""
    body = {k: v for k, v in client_body.items() if k not in ("stream", "stream_options", "include_reasoning")}
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}  # usage of every round is added up
    if start.continuation is None:
        return body
    partial = start.continuation.content
    body["messages"] = [*client_body["messages"], {"role": "assistant", "content": partial}]
    body["continue_final_message"] = True
    body["add_generation_prompt"] = False
    if start.max_tokens is not None:
        body["max_completion_tokens" if "max_completion_tokens" in client_body else "max_tokens"] = start.max_tokens
    return body


# The chain's own rounds: vLLM's chat completions, which every door but one is translated to; a door whose
# rounds differ brings its RoundWire (`Door.round_wire`: the completions door).
CHAT_WIRE = RoundWire(CHAT_PATH, chat_round_body, ChatChunkReader)


@dataclass
class ChainSession:
    settings: Settings
    policy: RequestPolicy
    view: RequestView  # what detectors and regenerators may know; its accepted steps come from the machine
    generator: VLLMClient
    detector: Detector
    regenerator: Regenerator
    metrics: Metrics
    body: dict[str, Any]  # the client's body, unknown fields included, forwarded to vLLM
    model_label: str = "other"
    hidden_states: Any = None  # a HiddenStatesClient when features are recorded for traces
    wire: RoundWire = CHAT_WIRE  # the door's upstream: chat completions unless the door says otherwise
    verification_s: float = 0.0  # time the client waited on checks and rewrites
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # detect mode: the checker task's results, waiting for the driver to feed them to the machine
    _results: deque[Checked] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        # `include_reasoning: false` asks vLLM to leave the thinking out of the response. The proxy still
        # reads (and checks, and corrects) it, since the answer is written from it: it is dropped on the
        # way out instead.
        self.hide_reasoning = self.body.get("include_reasoning") is False
        if self.view.reasoning_format is None:
            # the view carries it so that hidden-state captures render the chain with the model's markers
            reasoning_format = reasoning_format_of(self.settings, self.policy, self.wire.reasoning_format)
            self.view = dataclasses.replace(self.view, reasoning_format=reasoning_format)
        self.reasoning_format = self.view.reasoning_format
        rules = chain_rules(self.settings, self.policy, self.detector, self.body, self.reasoning_format)
        self.core = new_machine(rules)

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.core.steps

    def result(self) -> ChainResult:
        return self.core.result()

    async def run(self) -> AsyncIterator[Emit]:
        """Performs the machine's actions until it ends; a failure is raised after what was emitted."""
        batches = self.run_batches()
        try:
            async for batch in batches:
                for action in batch:
                    yield action
        finally:  # closed with this generator, not left to the garbage collector: its round closes now
            await batches.aclose()

    async def run_batches(self) -> AsyncIterator[list[Emit]]:
        """`run`'s emits, those the machine gives without waiting in between handed over together, so
        that a door writes what one upstream read brought as one write (one syscall, one pass through
        the middleware). A batch is handed over before any wait, so no emit is held back."""
        core, detect = self.core, self.policy.mode == "detect"
        ready: list[Emit] = []
        # actions done without waiting (detect mode hands a check to its checker task): a batch goes on
        no_wait: tuple[type, ...] = (StartRound, Check) if detect else (StartRound,)
        checks: asyncio.Queue[Check] = asyncio.Queue()  # detect mode: work for the checker
        task: asyncio.Task[None] | None = None
        # detect mode checks beside the rounds, for the whole request: a round may be resumed while a
        # check is in flight
        checker = asyncio.create_task(self._checker(checks)) if detect else None
        try:
            while True:
                action = core.next_action()
                if isinstance(action, _EMITS):
                    if self._deliver(action):
                        ready.append(action)
                        if isinstance(action, EmitEnd):
                            yield ready
                            return
                    continue
                if ready and not isinstance(action, no_wait):
                    yield ready  # before any wait (or a failure): what was emitted goes out first
                    ready = []
                if action is WAIT:  # the round's next step or end (in detect mode: or a check's result)
                    await self._next_event()
                elif isinstance(action, (StartRound, DropRound)):
                    task = await self._round(action, task)
                elif isinstance(action, Check) and detect:
                    checks.put_nowait(action)
                else:
                    await self._perform(action)
        finally:
            helpers = [t for t in (task, checker) if t is not None]
            # Every helper is cancelled before the first await: under a cancelled anyio scope (starlette's
            # stream cancelled by the client leaving) each await here raises again at once, and a helper
            # not yet cancelled would be left pending until the garbage collector destroys it.
            for helper in helpers:
                helper.cancel()
            for helper in helpers:
                await _cancel(helper)

    async def _round(
        self, action: StartRound | DropRound, task: asyncio.Task[None] | None
    ) -> asyncio.Task[None] | None:
        """Starts a round's reader, or drops the running one; gives the reader's task now running."""
        if isinstance(action, StartRound):
            core, wire = self.core, self.wire
            body = wire.round_body(self.body, action)
            reader = RoundReader(self.generator, body, core, core.round, self._wake, wire.path, wire.reader)
            return asyncio.create_task(reader.run())
        assert task is not None
        await _cancel(task)  # closes the upstream stream: vLLM aborts, the read-ahead goes
        return None

    async def _perform(self, action: object) -> None:
        """An action the session waits on in line: a check (correct mode), a regeneration, a failure, a note."""
        if isinstance(action, Check):
            self.core.receive(await self._verify(action))
        elif isinstance(action, Regenerate):
            self.core.receive(await self._regenerate(action))
        elif isinstance(action, Fail):
            raise action.error
        elif isinstance(action, Note):
            await self._note(action)

    async def _note(self, action: Note) -> None:
        """Counts a regeneration try or an upstream break; a resume waits before its round starts."""
        if isinstance(action, RegenerationNote):
            self.metrics.regeneration_attempts.labels(action.outcome).inc()
            return
        self.metrics.upstream_resumes.labels(action.outcome).inc()
        if action.outcome is ResumeOutcome.RESUMED:
            await asyncio.sleep(RESUME_BACKOFF_S[min(action.attempt, len(RESUME_BACKOFF_S)) - 1])

    async def _next_event(self) -> None:
        """Waits for the reader's wake-up or a verdict of the checker's; detect mode's verdicts are fed to
        the machine here, by the session: the checker task only hands them over."""
        if not self._results:
            await self._wakeup.wait()
            self._wakeup.clear()
        while self._results:
            self.core.receive(self._results.popleft())

    def _wake(self) -> None:
        self._wakeup.set()

    def _deliver(self, action: Emit) -> bool:
        """Counts the steps an emit settles; False when it is not sent (the client asked for no reasoning)."""
        if isinstance(action, EmitText) and action.step is not None:
            count_step(self.metrics, action.step, self.policy.detector, self.model_label)
        elif isinstance(action, EmitVerdicts):
            for step in action.steps:
                count_step(self.metrics, step, self.policy.detector, self.model_label)
        return not (self.hide_reasoning and isinstance(action, EmitText) and action.channel is Channel.REASONING)

    # ---- the I/O the machine asks for ---------------------------------------------------------

    async def _checker(self, checks: asyncio.Queue[Check]) -> None:
        while True:
            check = await checks.get()
            try:
                result = await self._verify(check)
            except Exception as exc:  # a bug in a detector: the machine fails the request with it
                result = Checked(error=exc)
            self._results.append(result)
            self._wake()

    async def _verify(self, check: Check) -> Checked:
        """`verify` (server/chain/verify.py) with this request's view, detector, metrics and features."""
        return await verify(
            check,
            self.view,
            self.detector,
            name=self.policy.detector,
            metrics=self.metrics,
            hidden_states=self.hidden_states,
            timed=self._waited,
        )

    def _waited(self, seconds: float) -> None:
        self.verification_s += seconds

    async def _regenerate(self, action: Regenerate) -> Regenerated:
        started = time.perf_counter()
        view = self.view.with_accepted(action.accepted)
        try:
            rewrite = await self.regenerator.regenerate(view, action.prefix, action.step, action.attempt)
            return Regenerated(rewrite.candidate, usage=rewrite.usage, insisted=rewrite.insisted)
        except RegenerationError as exc:
            return Regenerated(error=exc)
        finally:
            self.verification_s += time.perf_counter() - started


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
        task.exception()  # retrieved: a failed task's error was already handed over as an event
