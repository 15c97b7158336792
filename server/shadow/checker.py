"""Shadow checks: a share of `off` requests verified after their response has ended, off their path.

An operator who serves most traffic in `off` still wants the UPR of that traffic. A request admitted in
off mode is drawn at its share (FAITHPROXY_SHADOW_SHARE, or its key's `shadow_share` in the policy file;
server/admission/admit.py sets `Admitted.shadow`). Off mode (server/doors/off.py) serves it exactly as any
other: the client's bytes go to vLLM and vLLM's bytes come back, unchanged and unwaited; the only extra
is a reference to each chunk it sent, kept (up to FAITHPROXY_SHADOW_MAX_BYTES) in a `ShadowCapture`.
When the response has ended, `ShadowChecker.submit` takes the capture without waiting for anything, and a
worker later reads it in its door's wire (`Door.shadow_reader`, in each door's module of server/doors/),
takes the request as detect mode would have run it on that door (`shadow_request`: the door's
`translate` and `messages`; a request detect mode would refuse there is counted `unreadable`) and
replays it into detect mode's own machine (a DetectMachine, built from detect mode's rules for that
door: server/chain/verify.py `chain_rules`, with the door's round wire's reasoning format) through the
machine's public interface: the round's events go in one word at a time, and every check the machine
asks for is answered, by detect mode's own `verify`, before the next word is read (`replay`).
So each step is checked as live detect mode checks it when the judge keeps up with decoding: on its own,
with the steps before it as context, a second unfaithful step after a flag included. Only detectors that
need nothing from the live stream make sense here (judge, prompt: FAITHPROXY_SHADOW_DETECTOR).

Bounded everywhere: at most FAITHPROXY_SHADOW_QUEUE checks wait (each holding at most shadow_max_bytes:
queue × max bytes is the most the waiting checks hold, 64 MiB by default),
FAITHPROXY_SHADOW_CONCURRENCY run, and a token bucket of FAITHPROXY_SHADOW_TOKENS_PER_MINUTE (judge tokens
as the judge budget counts them, plus the generator tokens of self-checks) refuses checks once spent.
Every sampled request ends in exactly one faithproxy_shadow_requests_total outcome (server/observe/metrics.py
ShadowOutcome); a checked one adds its perception steps to faithproxy_perception_steps_total{source="shadow"},
writes a trace record with `"source": "shadow"` and puts a report (source shadow) under the request's id.
A judge that fails leaves its steps unchecked (counted, as in detect mode); a check that fails outright
is counted `failed`; neither reaches the client, whose response ended before the check began.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faithproxy.faithcore.context import JudgeUsage, RequestView
from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.images import images_in_messages, last_user_text
from faithproxy.server.admission.admit import Admitted
from faithproxy.server.observe.metrics import ShadowOutcome, Source
from faithproxy.server.observe.reports import report
from faithproxy.server.observe.step_metrics import perception_verdicts
from faithproxy.server.observe.summary import summarize
from faithproxy.server.observe.traces import RequestTrace
from faithproxy.server.protocol.doors import Door
from faithproxy.server.state import AppState, Capture

if TYPE_CHECKING:  # the machine brings its segmenter (nltk): loaded with the first check, not here
    from faithproxy.faithcore.correction import ChainMachine, Check, Checked, Event

log = logging.getLogger("faithproxy.shadow")

# A word and the whitespace before it: how a replay cuts text (any cut gives the segmenter the same steps).
_PIECE = re.compile(r"\s*\S+|\s+")
# Events a replay reads between two turns of the event loop (about a millisecond of the machine's work): the
# requests being served share the loop with the checks.
_YIELD_EVERY = 256


class ShadowCapture:
    """The bytes of a sampled off response, referenced as they pass (no copy), up to `limit` bytes; past
    it the capture is abandoned (`overflow`) and holds nothing."""

    __slots__ = ("limit", "overflow", "parts", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.overflow = False

    def add(self, data: bytes) -> None:
        if self.overflow:
            return
        self.size += len(data)
        if self.size > self.limit:
            self.overflow = True
            self.parts = []
            return
        self.parts.append(data)

    def data(self) -> bytes:
        return b"".join(self.parts)


@dataclass(frozen=True)
class ShadowRequest:
    """The request as detect mode would have run it on its door."""

    body: dict[str, Any]  # the chat body (for completions: the client's body)
    messages: list[dict[str, Any]]  # what detectors and judges read


def shadow_request(door: Door, body: dict[str, Any]) -> ShadowRequest | None:
    """`body` as its door's detect mode would have run it, or None where detect mode refuses it (n > 1, a
    prompt that is not one string, echo, tools, ...: what the door's `translate` refuses)."""
    try:
        chat = door.translate(body, "detect") if door.translate is not None else body
    except PolicyError:
        return None
    if (chat.get("n") or 1) != 1:
        return None
    return ShadowRequest(chat, door.messages(chat))


def pieces(events: Iterable[Event]) -> Iterator[Event]:
    """The events with every text delta cut into words (each with the whitespace before it), as a model's
    tokens would have come: a replay fed one piece at a time completes at most about one step per piece."""
    from faithproxy.faithcore.correction import Delta

    for event in events:
        if isinstance(event, Delta):
            for match in _PIECE.finditer(event.text):
                yield Delta(event.field, match.group())
        else:
            yield event


async def replay(machine: ChainMachine, events: Iterable[Event], check: Callable[[Check], Awaitable[Checked]]) -> None:
    """Drives `machine` (detect mode's) through one recorded round: one event at a time, and after each,
    what the machine asks for until it waits for the next; a Check is answered (`check`) before another
    event is read. Returns at its end; a Fail is raised. Emits go nowhere: the client was served already."""
    from faithproxy.faithcore.correction import WAIT, Check, EmitEnd, Fail, StartRound

    pending = iter(events)
    read = 0
    while True:
        action = machine.next_action()
        if action is WAIT:
            event = next(pending, None)
            if event is None:
                raise RuntimeError("the recorded round has ended, but the machine waits for more")
            machine.receive(event)
            read += 1
            if read % _YIELD_EVERY == 0:  # a long run of steps with nothing to check must not hold the loop
                await asyncio.sleep(0)
        elif isinstance(action, Check):
            machine.receive(await check(action))
        elif isinstance(action, Fail):
            raise action.error
        elif isinstance(action, EmitEnd):
            return
        elif isinstance(action, StartRound) and action.prefix is not None:
            raise RuntimeError("a replay has one round: the machine asked to continue in another")
        # the first StartRound (the recording is that round), emits, notes: nothing to do


class TokenBucket:
    """`per_minute` tokens a minute, refilled continuously; a check may start while the bucket holds any
    (its spend is known only afterwards, so one check may overdraw it, and the next waits for the refill)."""

    def __init__(self, per_minute: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._level = float(per_minute or 0)
        self._at = clock()

    def _refill(self) -> float:
        now = self._clock()
        if self.per_minute is not None:
            self._level = min(float(self.per_minute), self._level + (now - self._at) * self.per_minute / 60.0)
        self._at = now
        return self._level

    def available(self) -> bool:
        return self.per_minute is None or self._refill() > 0

    def spend(self, tokens: int) -> None:
        self._refill()
        self._level -= tokens


@dataclass
class _Sampled:
    admitted: Admitted
    capture: Capture
    model: str


@dataclass
class ShadowChecker:
    """Checks sampled off requests in the background (see the module's docstring). `submit` never waits.
    Off mode reaches it as the app state's `shadow` (server/state.py ShadowSampler)."""

    state: AppState
    queue_size: int
    concurrency: int
    budget: TokenBucket
    detector: str
    _waiting: deque[_Sampled] = field(default_factory=deque)
    _workers: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def from_state(cls, state: AppState) -> ShadowChecker:
        s = state.settings
        if s.shadow_share > 0 and s.shadow_detector not in state.detectors:
            log.warning("FAITHPROXY_SHADOW_DETECTOR=%s is not available here: sampled requests will count as failed "
                        "(the judge detector needs a configured judge)", s.shadow_detector)  # fmt: skip
        budget = TokenBucket(s.shadow_tokens_per_minute)
        return cls(state, s.shadow_queue, s.shadow_concurrency, budget, s.shadow_detector)

    def capture_for(self, admitted: Admitted) -> ShadowCapture | None:
        """A capture for a sampled request this checker can read (its door has a shadow reader), else None."""
        if not admitted.shadow:
            return None
        door = self.state.doors.get(admitted.endpoint)
        if door is None or door.shadow_reader is None:
            return None
        return ShadowCapture(self.state.settings.shadow_max_bytes)

    def submit(self, admitted: Admitted, capture: Capture | None, *, complete: bool) -> None:
        """A sampled off request has ended: queue its check, or count why not. `complete`: the response
        was whole (2xx, not cut off, the client stayed)."""
        metrics = self.state.metrics
        model = metrics.model_label(admitted.body.get("model"))
        outcome = metrics.shadow_requests
        if capture is None or capture.overflow or not complete:
            outcome.labels(model, admitted.endpoint, ShadowOutcome.UNREADABLE).inc()
            return
        if not self.budget.available():
            outcome.labels(model, admitted.endpoint, ShadowOutcome.OVER_BUDGET).inc()
            return
        if len(self._waiting) >= self.queue_size:
            outcome.labels(model, admitted.endpoint, ShadowOutcome.QUEUE_FULL).inc()
            return
        self._waiting.append(_Sampled(admitted, capture, model))  # parsed by the worker, off the request's task
        metrics.shadow_queue.inc()
        if len(self._workers) < self.concurrency:
            task = asyncio.get_running_loop().create_task(self._work())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def _work(self) -> None:
        while self._waiting:
            item = self._waiting.popleft()
            try:
                outcome = await self._check(item)
            except Exception:  # noqa: BLE001 - a bug in a check must not end the worker or go unseen
                log.exception("shadow check of %s failed", item.admitted.request_id)
                outcome = ShadowOutcome.FAILED
            finally:
                self.state.metrics.shadow_queue.dec()
            self.state.metrics.shadow_requests.labels(item.model, item.admitted.endpoint, outcome).inc()

    async def _check(self, item: _Sampled) -> ShadowOutcome:
        # Loaded with the first check, not with this module: app.py imports the checker into every
        # server, and a server that only passes requests through never needs the correction machine.
        # (nltk itself is loaded at start-up today, through observe/metrics.py resolving every detector:
        # issue 49's lazy-imports item.)
        from faithproxy.faithcore.correction import new_machine
        from faithproxy.server.chain.session import CHAT_WIRE
        from faithproxy.server.chain.verify import chain_rules, reasoning_format_of, verify

        state, admitted = self.state, item.admitted
        detector = state.detectors.get(self.detector)
        if detector is None:
            return ShadowOutcome.FAILED
        door = state.doors.get(admitted.endpoint)
        reader = door.shadow_reader if door is not None else None
        request = shadow_request(door, admitted.body) if door is not None and reader is not None else None
        events = reader(item.capture.data(), admitted.stream) if reader is not None and request else None
        item.capture = ShadowCapture(0)  # the bytes are not needed past here
        if request is None or not events:
            return ShadowOutcome.UNREADABLE
        assert door is not None
        started = time.perf_counter()
        messages = request.messages
        images = images_in_messages(messages)
        policy = dataclasses.replace(admitted.policy, mode="detect", detector=self.detector, hints=False)
        if detector.uses_judge and state.judge_fetches_images(policy.judge):
            assert state.image_fetcher is not None
            images = await state.image_fetcher.fetch_all(images)
        # As the door's detect mode would see it: the reasoning format of the door's round wire, and the
        # rules (batch size, gate) detect mode runs under there.
        wire = door.round_wire or CHAT_WIRE
        reasoning_format = reasoning_format_of(state.settings, policy, wire.reasoning_format)
        view = RequestView(
            request_id=admitted.request_id,
            model=admitted.body["model"],
            messages=messages,
            question=last_user_text(messages),
            images=images,
            judge=policy.judge,
            options=policy.detector_options(),
            reasoning_format=reasoning_format,
        )
        spent = JudgeUsage()
        view.judge_state.on_call = functools.partial(self._on_judge_call, spent, admitted.key_policy)
        machine = new_machine(chain_rules(state.settings, policy, detector, request.body, reasoning_format))
        check = functools.partial(verify, view=view, detector=detector, name=self.detector, metrics=state.metrics)
        error = None
        try:
            await replay(machine, pieces(events), check)
        except Exception as exc:  # noqa: BLE001 - the machine failed the chain (a detector error under `fail`)
            error = exc
        result = machine.result()
        generator_tokens = int(result.usage.get("total_tokens") or 0)  # self-checks: the replay carries none
        self.budget.spend(spent.budget_tokens + generator_tokens)
        state.metrics.shadow_tokens.inc(spent.budget_tokens + generator_tokens)
        steps = list(result.steps)
        state.metrics.count_perception(Source.SHADOW, item.model, admitted.endpoint, perception_verdicts(steps))
        elapsed = time.perf_counter() - started
        summary = summarize(
            steps,
            mode="detect",
            detector=self.detector,
            regenerations=0,
            verification_s=elapsed,
            rounds=result.rounds,
            judge=view.judge_state.summary(),
        )
        self._record(admitted, view, steps, summary, elapsed)
        return ShadowOutcome.FAILED if error is not None else ShadowOutcome.CHECKED

    def _on_judge_call(self, spent: JudgeUsage, policy: str, judge: str, call: JudgeUsage) -> None:
        spent.add(call)
        self.state.metrics.count_judge_call(judge, call, policy=policy)

    def _record(
        self, admitted: Admitted, view: RequestView, steps: list[Any], summary: dict[str, Any], elapsed: float
    ) -> None:
        """The check's trace record and report, both marked source shadow."""
        state = self.state
        trace = RequestTrace(
            admitted,
            question=view.question,
            image_hashes=[i.sha256 for i in view.images],
            steps=steps,
            summary=summary,
            judge_usage=view.judge_state.summary(),
            verification_s=elapsed,
            source=Source.SHADOW,
        )
        if state.tracer.path is not None:
            try:
                state.tracer.write(trace.record(time.perf_counter() - admitted.started))
            except OSError:
                log.exception("could not write the shadow trace of %s", admitted.request_id)
        if state.reports is not None:
            state.reports.put(admitted.request_id, report(trace))

    async def drained(self) -> None:
        """Returns once no check waits or runs (tests, benchmarks: the checks of what was sent are done)."""
        while self._workers:
            await asyncio.wait(list(self._workers))

    async def aclose(self) -> None:
        """At the lifespan's end: the waiting checks are dropped, the running ones cancelled."""
        dropped = len(self._waiting)
        self._waiting.clear()
        self.state.metrics.shadow_queue.dec(dropped)
        for task in list(self._workers):
            task.cancel()
        if self._workers:
            await asyncio.wait(list(self._workers))
