"""The correction core: the paper's Algorithm 2 as a synchronous state machine, with no I/O inside.

Like h11, it is told what happened and says what to do; it never waits, reads a socket or counts a
metric. `receive(event)` takes what arrived: a reader item of the current round (Step, TextDelta,
ExtraDelta, TrailingRaw, RoundEnd, RoundFailed) or the result of an action (Checked, Regenerated).
`next_action()` returns what to do now, one action at a time: an Emit* for the client, Check a batch,
Regenerate a step, StartRound / DropRound an upstream stream, Tried (a regeneration try's outcome, to
count), Fail, or WAIT when it needs the next event. server/session.py performs the actions.

correct mode, per round:
  every step read so far (at most max_batch_steps) is checked as one batch while the round reads on;
  faithful and reasoning steps are emitted in order; at the first unfaithful perception step the round
  is dropped (vLLM stops decoding), the step is regenerated up to K times, each candidate re-checked,
  and a new round continues from the accepted text. After K failed tries the ORIGINAL step is kept (the
  model's own text; no candidate was better by the detector's standard), residual, and decoding goes on
  after it: the dropped round's read-ahead continued exactly that prefix, so what it read (whole steps)
  is checked and delivered as if the round had never stopped, and the new round starts after it (or
  none starts, when the round had ended). A rewrite makes the read-ahead stale: it goes. Steps before
  an upstream failure are still delivered; the failure comes after them.
detect mode:
  text is emitted as it arrives, steps are checked in batches one call at a time, and their verdicts
  follow in EmitVerdicts; nothing is rewritten, an unfaithful step is residual (not corrected).

The core owns each step's outcome (verdict, residual and its reason, unchecked and its reason), the
regeneration budget of the request, and the completion-token budget across rounds. A step leaves the
core in an EmitText (correct mode) or an EmitVerdicts (detect mode) with its outcome final: that is
when the driver counts it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.errors import DetectorError
from faithproxy.faithcore.reasoning_formats import FORMATS, Continuation, ReasoningFormat
from faithproxy.faithcore.types import Channel, Faithfulness, Step, StepKind, Verdict
from faithproxy.server.reader import ExtraDelta, Item, RoundEnd, RoundFailed, TextDelta, TrailingRaw

# ---- what the core hands out -------------------------------------------------------------------


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
class StartRound:
    """Open an upstream stream. `accepted` is None for the first round; for a continuation it is the
    accepted raw text per channel, `continuation` the partial assistant message the reasoning format
    makes of it and whether the round starts after the think block, and `max_tokens` what is left of the
    client's completion budget (None: the client set none)."""

    accepted: dict[Channel, str] | None = None
    max_tokens: int | None = None
    continuation: Continuation | None = None


@dataclass
class DropRound:
    """Close the current upstream stream (vLLM aborts the generation); what it read ahead is gone."""


@dataclass
class Check:
    """Send `steps` to the detector (one call). `candidate`: a regenerated step being re-checked."""

    steps: list[Step]
    candidate: bool = False


@dataclass
class Regenerate:
    step: Step
    prefix: list[str]  # the accepted steps' text
    attempt: int  # from 1


@dataclass
class Tried:
    """A regeneration try ended: fixed | still_unfaithful | unparseable | error."""

    step: Step
    attempt: int
    outcome: str


@dataclass
class Fail:
    """The request fails with `error` (after whatever was emitted before)."""

    error: BaseException


class _Wait:
    def __repr__(self) -> str:
        return "WAIT"


WAIT = _Wait()  # nothing to do until the next event is received

Action = Emit | StartRound | DropRound | Check | Regenerate | Tried | Fail | _Wait

# ---- what the core is told ---------------------------------------------------------------------


@dataclass
class Checked:
    """The detector's answer to the last Check: one verdict per step, or the error of the call."""

    verdicts: list[Verdict] | None = None
    error: BaseException | None = None


@dataclass
class Regenerated:
    """The regenerator's answer to the last Regenerate: a candidate, None (nothing usable), or an error."""

    candidate: str | None = None
    error: BaseException | None = None


Event = Item | Checked | Regenerated

# ---- the rules of one request ------------------------------------------------------------------


@dataclass(frozen=True)
class Rules:
    mode: Literal["correct", "detect"]
    detector: str  # its name, for the verdicts the core writes itself (never compared)
    max_retries: int = 3  # K
    max_regenerations: int = 16  # regeneration tries one request may spend
    max_batch_steps: int = 16
    on_detector_error: Literal["pass", "fail"] = "pass"
    detector_checks: bool = True  # Detector.checks: False for `none`, whose UNKNOWN is no error
    detector_types_steps: bool = False  # Detector.types_steps: it gets batches without perception steps
    # The judge gate (Settings.judge_every_step off): a batch in which the step typer found no perception
    # step goes to no detector, not even one that types steps itself; its steps leave unchecked, `gated`.
    gate_without_perception: bool = False
    completion_budget: int | None = None  # the client's max_tokens / max_completion_tokens
    # Where the model writes its thinking and how its template renders a partial message (continuations).
    reasoning_format: ReasoningFormat = FORMATS["think"]


@dataclass
class SessionStats:
    verification_s: float = 0.0  # written by the driver: time the client waited on checks and rewrites
    regenerations: int = 0  # regeneration tries over the whole request
    rounds: int = 0
    upstream_id: str | None = None


@dataclass
class CompletionBudget:
    """The client's completion-token limit spread over every round of the request."""

    limit: int | None
    used: int = 0

    def remaining(self) -> int | None:
        return None if self.limit is None else self.limit - self.used


@dataclass
class _ReadAhead:
    """What the dropped round had read past the flagged step: its items, and its end if it had one."""

    items: list[Item]
    end: RoundEnd | None


@dataclass
class _Fix:
    """A step being regenerated."""

    step: Step
    prefix: list[str]
    read_ahead: _ReadAhead | None = None
    attempt: int = 0
    candidate: str | None = None  # the candidate being re-checked


class CorrectionCore:
    """The state of one request's chain; see the module docstring.

    `steps`, `stats` and `field_names` may be handed in so that the session shares them: the core fills
    them in. `ctx.accepted` gets every step the detector may treat as context, `ctx.usage` every round's
    tokens.
    """

    def __init__(
        self,
        rules: Rules,
        ctx: ChainContext,
        *,
        steps: list[Step] | None = None,
        stats: SessionStats | None = None,
        field_names: dict[Channel, str] | None = None,
    ) -> None:
        self.rules = rules
        self.ctx = ctx
        self.steps = [] if steps is None else steps  # every step emitted, in order
        self.stats = SessionStats() if stats is None else stats
        self.field_names = {} if field_names is None else field_names  # the delta field of each channel
        self.budget = CompletionBudget(rules.completion_budget)
        self._batch_limit = max(1, rules.max_batch_steps)  # a batch holds at least the step at its head
        self._out: deque[Action] = deque()
        self._over = False
        self._accepted_raw = {Channel.REASONING: "", Channel.CONTENT: ""}
        # the round being read
        self._open = False
        self._pending: deque[Item] = deque()  # correct mode: items waiting for their batch
        self._to_check: list[Step] = []  # detect mode: steps sent, not yet checked
        self._end: RoundEnd | None = None
        self._failure: RoundFailed | None = None
        self._deltas = 0
        self._tallied = False
        # what is in flight: a batch being checked, or a step being fixed
        self._batch: list[Item] | None = None
        self._fix: _Fix | None = None
        self._start_round(None)

    # ---- the interface ----------------------------------------------------------------------

    def next_action(self) -> Action:
        if not self._out:
            if self._over:
                raise RuntimeError("the chain is over: nothing more to do")
            self._decide()
        return self._out.popleft() if self._out else WAIT

    def receive(self, event: Event) -> None:
        if self._over:
            return  # a late result after a failure: nothing depends on it any more
        if isinstance(event, Checked):
            self._on_checked(event)
        elif isinstance(event, Regenerated):
            self._on_regenerated(event)
        elif self._open:
            self._on_item(event)
        # else: an item of a dropped round, read before the drop took effect

    # ---- reader items -----------------------------------------------------------------------

    def _on_item(self, item: Item) -> None:
        detect = self.rules.mode == "detect"
        if isinstance(item, RoundEnd):
            self._end = item
            if item.first_chunk and self.stats.upstream_id is None:
                self.stats.upstream_id = item.first_chunk.get("id")
            self._tally_round()
        elif isinstance(item, RoundFailed):
            self._failure = item
            if detect:
                self._fail(item.error)  # the text already went out: nothing left to deliver first
        elif isinstance(item, TextDelta):
            self._deltas += 1
            self.field_names.setdefault(item.channel, item.field)
            if detect:
                self._out.append(EmitText(item.channel, item.field, item.text))
        elif detect and isinstance(item, Step):
            item.index = len(self.steps)
            self.steps.append(item)
            self._to_check.append(item)
        elif detect and isinstance(item, ExtraDelta):
            self._out.append(EmitExtra(item.delta))
        elif not detect:
            self._pending.append(item)  # steps, trailing raw and extras, in order (deltas are not sent)
        # detect mode drops TrailingRaw: its text went out as TextDelta

    def _tally_round(self) -> None:
        """Adds the round's completion tokens to the request's usage and budget, once: vLLM's count when
        the round ended, else an estimate (an aborted round reports no usage; vLLM streams about one token
        per text delta)."""
        if self._tallied:
            return
        self._tallied = True
        if self._end is not None:
            self.ctx.usage.add(self._end.usage)
            self.budget.used += int((self._end.usage or {}).get("completion_tokens") or 0)
        else:
            self.ctx.usage.completion_tokens += self._deltas
            self.budget.used += self._deltas

    # ---- decisions --------------------------------------------------------------------------

    def _decide(self) -> None:
        if self._batch is not None or self._fix is not None:
            return  # a result is awaited
        if self.rules.mode == "detect":
            self._decide_detect()
            return
        while self._pending and self._batch is None and not self._over:
            self._take_batch()
        if self._pending or self._batch is not None or self._out:
            return
        if self._failure is not None:
            self._fail(self._failure.error)
        elif self._end is not None:
            self._finish(self._end.finish_reason)

    def _take_batch(self) -> None:
        """The next items up to max_batch_steps steps (with the non-step items between and after them):
        checked in one call when there is something to check, emitted at once otherwise."""
        batch: list[Item] = []
        steps = 0
        while self._pending:
            if isinstance(self._pending[0], Step):
                if steps == self._batch_limit:
                    break
                steps += 1
            batch.append(self._pending.popleft())
        new_steps = [i for i in batch if isinstance(i, Step)]
        if self._worth_checking(new_steps):
            self._batch = batch
            self._out.append(Check(new_steps))
        else:
            self._emit_batch(batch)

    def _worth_checking(self, steps: list[Step]) -> bool:
        """No call for a batch of whitespace or tool calls, nor for one without a perception step when the
        detector only looks at those. One that types steps itself is sent everything, unless the gate is
        on: then such a batch goes to nobody, and its steps are marked `gated` (the driver counts them)."""
        if not steps:
            return False
        if any(s.kind is StepKind.PERCEPTION for s in steps):
            return True
        if not self.rules.detector_types_steps:
            return False
        if self.rules.gate_without_perception:
            for step in steps:
                step.unchecked_reason = "gated"
            return False
        return True

    def _decide_detect(self) -> None:
        while self._to_check and self._batch is None:
            limit = self._batch_limit
            batch, self._to_check = self._to_check[:limit], self._to_check[limit:]
            if self._worth_checking(batch):
                self._batch = list(batch)
                self._out.append(Check(batch))
            else:
                self._settle_verdicts(batch)
        if self._end is not None and self._batch is None and not self._to_check and not self._out:
            self._finish(self._end.finish_reason)

    # ---- verdicts ---------------------------------------------------------------------------

    def _on_checked(self, checked: Checked) -> None:
        if self._fix is not None and self._fix.candidate is not None:
            self._on_candidate_checked(checked)
            return
        if self._batch is None:
            raise RuntimeError("a check result arrived, but no check was asked for")
        batch, self._batch = self._batch, None
        steps = [i for i in batch if isinstance(i, Step)]
        if not self._apply(steps, checked):
            return
        if self.rules.mode == "detect":
            self._settle_verdicts(steps)
        else:
            self._emit_batch(batch)

    def _apply(self, steps: list[Step], checked: Checked) -> bool:
        """Writes the verdicts on `steps` (their first verdict: the one detected UPR counts). False when
        the request fails instead (a detector error under on-detector-error=fail, or a bug)."""
        if checked.error is not None:
            if not self._passes(checked.error):
                self._fail(checked.error)
                return False
            unknown = Verdict(Faithfulness.UNKNOWN, self.rules.detector, reason=_message(checked.error))
            for step in steps:
                step.verdict = step.first_verdict = unknown
                step.unchecked_reason = "detector_error"
            return True
        assert checked.verdicts is not None and len(checked.verdicts) == len(steps), "one verdict per step"
        for step, verdict in zip(steps, checked.verdicts, strict=True):
            if verdict.kind is not None and verdict.kind is not step.kind:
                step.typed_kind = step.typed_kind or step.kind
                step.kind = verdict.kind  # the detector's typing is better than the keyword heuristic
            step.verdict = step.first_verdict = verdict
            if verdict.unchecked and step.kind is StepKind.PERCEPTION:  # e.g. the judge's "budget"
                step.unchecked_reason = verdict.unchecked
        return True

    def _passes(self, error: BaseException) -> bool:
        """A detector error lets the steps through unchecked under on-detector-error=pass; anything else
        (a bug in a detector) fails the request."""
        return isinstance(error, DetectorError) and self.rules.on_detector_error == "pass"

    def _settle_verdicts(self, steps: list[Step]) -> None:
        """detect mode: the steps' outcomes are final; their verdicts go to the client."""
        for step in steps:
            if _flagged(step):
                _residual(step, "not_corrected")
            self._settle(step)
        self.ctx.accepted.extend(steps)
        self._out.append(EmitVerdicts(list(steps)))

    def _emit_batch(self, batch: list[Item]) -> None:
        """correct mode: emits a checked batch in order, up to its first unfaithful step if that one is
        to be regenerated (the rest of the round is dropped then)."""
        for pos, item in enumerate(batch):
            if isinstance(item, Step) and _flagged(item):
                if self._may_regenerate():
                    read_ahead = _ReadAhead([*batch[pos + 1 :], *self._pending], self._end)
                    self._drop_round()
                    self._fix = _Fix(item, prefix=[s.text for s in self.steps], read_ahead=read_ahead)
                    self._next_try()
                    return
                _residual(item, "not_corrected")
            if isinstance(item, Step):
                self._accept(item)
            elif isinstance(item, TrailingRaw):
                self._accepted_raw[item.channel] += item.raw
                self._out.append(EmitText(item.channel, self._field(item.channel), item.raw))
            elif isinstance(item, ExtraDelta):
                self._out.append(EmitExtra(item.delta))
        if any(isinstance(i, Step) for i in batch):
            self._after_batch()

    def _after_batch(self) -> None:
        """Called once a batch with steps has been emitted whole. The pipelined loop reads on; the
        benchmark's strictly sequential variant overrides this to continue in a new round instead."""

    def _accept(self, step: Step) -> None:
        self._settle(step)
        self._accepted_raw[step.channel] += step.raw
        step.index = len(self.steps)
        self.steps.append(step)
        self.ctx.accepted.append(step)
        self._out.append(EmitText(step.channel, self._field(step.channel), step.raw, step))

    def _settle(self, step: Step) -> None:
        """A perception step that got no verdict leaves unchecked and residual: a step nobody checked is
        not a faithful one."""
        if step.kind is not StepKind.PERCEPTION:
            return
        first = step.first_verdict
        if first is None or first.faithfulness is Faithfulness.UNKNOWN:
            step.unchecked_reason = step.unchecked_reason or self._unknown_reason()
            if not step.residual:
                _residual(step, "unchecked")

    def _unknown_reason(self) -> str:
        return "detector_error" if self.rules.detector_checks else "detector_none"

    def _field(self, channel: Channel) -> str:
        return self.field_names.get(channel) or ("content" if channel is Channel.CONTENT else "reasoning")

    # ---- regeneration -----------------------------------------------------------------------

    def _may_regenerate(self) -> bool:
        return (
            self.rules.mode == "correct"
            and self.rules.max_retries > 0
            and self.stats.regenerations < self.rules.max_regenerations
        )

    def _next_try(self) -> None:
        fix = self._fix
        assert fix is not None
        fix.candidate = None
        if fix.attempt >= self.rules.max_retries or self.stats.regenerations >= self.rules.max_regenerations:
            _residual(fix.step, "regeneration_failed")  # the ORIGINAL text stays
            self._fixed()
            return
        fix.attempt += 1
        fix.step.attempts = fix.attempt
        self.stats.regenerations += 1
        self._out.append(Regenerate(fix.step, fix.prefix, fix.attempt))

    def _on_regenerated(self, result: Regenerated) -> None:
        fix = self._fix
        if fix is None or fix.candidate is not None:
            raise RuntimeError("a regeneration result arrived, but no regeneration was asked for")
        if result.error is not None or result.candidate is None:
            self._out.append(Tried(fix.step, fix.attempt, "error" if result.error is not None else "unparseable"))
            self._next_try()
            return
        fix.candidate = text = result.candidate
        trial = Step(index=fix.step.index, text=text, raw=text, channel=fix.step.channel, kind=fix.step.kind)
        self._out.append(Check([trial], candidate=True))

    def _on_candidate_checked(self, checked: Checked) -> None:
        fix = self._fix
        assert fix is not None and fix.candidate is not None
        step, candidate = fix.step, fix.candidate
        if checked.error is not None and not self._passes(checked.error):
            self._fail(checked.error)
            return
        verdict = checked.verdicts[0] if checked.verdicts else None
        if verdict is not None and verdict.unfaithful:
            step.rejected.append(candidate)
            self._out.append(Tried(step, fix.attempt, "still_unfaithful"))
            self._next_try()
            return
        self._out.append(Tried(step, fix.attempt, "fixed"))
        step.original_text = step.text
        step.raw = _leading(step.raw, step.text) + candidate
        step.text = candidate
        if verdict is None or verdict.faithfulness is Faithfulness.UNKNOWN:
            # the rewrite went out unchecked: residual, like any perception step without a verdict
            step.verdict = verdict or Verdict(Faithfulness.UNKNOWN, self.rules.detector, reason=_message(checked.error))
            step.unchecked_reason = "detector_error" if checked.error is not None else self._unknown_reason()
            if verdict is not None and verdict.unchecked:
                step.unchecked_reason = verdict.unchecked
            _residual(step, "unchecked")
        else:
            step.verdict = verdict
        self._fixed()

    def _fixed(self) -> None:
        """The step under regeneration is settled (rewritten or kept): emit it, continue after it."""
        fix, self._fix = self._fix, None
        assert fix is not None
        self._accept(fix.step)
        if fix.step.original_text is None and fix.read_ahead is not None and self._resume(fix.read_ahead):
            return
        self._continue()

    def _resume(self, read_ahead: _ReadAhead) -> bool:
        """After a kept step: the read-ahead goes back in line and decoding resumes after it. False
        (nothing changed) when it cannot: a non-text delta in it, which a continuation cannot carry.

        Its steps are checked again, in batches as they come: the verdicts they got came with the batch
        that flagged the step before them, and a judge that stops at the first unfaithful sentence
        leaves the ones after it unknown. The template's bridge (a think block it would close) goes
        after the read-ahead, as it would after any accepted text."""
        items = read_ahead.items
        if any(isinstance(item, ExtraDelta) for item in items):
            return False
        raw = dict(self._accepted_raw)
        for item in items:
            assert isinstance(item, Step | TrailingRaw)
            raw[item.channel] += item.raw
            if isinstance(item, Step):
                item.verdict = item.first_verdict = None
                item.unchecked_reason = None
                # its detector typing went with the discarded verdict: the judge gate and the next
                # detector see the step as the typer read it (one retyped as reasoning was gated here)
                item.kind, item.typed_kind = item.typed_kind or item.kind, None
        self._pending.extend(items)
        if read_ahead.end is not None:  # the round had ended: what it read is the rest of the chain
            self._end = read_ahead.end
            return True
        remaining = self.budget.remaining()
        if remaining is not None and remaining <= 0:
            self._end = RoundEnd("length", None)
            return True
        continuation = self.rules.reasoning_format.continuation(raw)
        for channel, text in continuation.bridge.items():
            self._pending.append(TrailingRaw(channel, text))
            raw[channel] += text
        self._start_round(StartRound(raw, remaining, continuation))
        return True

    # ---- rounds -----------------------------------------------------------------------------

    def _continue(self) -> None:
        """Start a round that continues from the accepted text, or end when the budget is spent.

        Text the template will put between the accepted text and the model's next token (a think block it
        closes: faithcore.reasoning_formats) is emitted and accepted first, as the model's own.
        """
        remaining = self.budget.remaining()
        if remaining is not None and remaining <= 0:
            self._finish("length")
            return
        continuation = self.rules.reasoning_format.continuation(self._accepted_raw)
        for channel, text in continuation.bridge.items():
            self._accepted_raw[channel] += text
            self._out.append(EmitText(channel, self._field(channel), text))
        self._start_round(StartRound(dict(self._accepted_raw), remaining, continuation))

    def _start_round(self, start: StartRound | None) -> None:
        self.stats.rounds += 1
        self._open, self._end, self._failure, self._deltas, self._tallied = True, None, None, 0, False
        self._out.append(start or StartRound())

    def _drop_round(self) -> None:
        self._tally_round()
        self._pending.clear()
        self._failure = None  # the dropped round's failure no longer matters: a new round follows
        if self._open:  # none is when the read-ahead of an ended round was resumed (_resume)
            self._open = False
            self._out.append(DropRound())

    def _finish(self, finish_reason: str | None) -> None:
        self._over = True
        self._out.append(EmitEnd(finish_reason))

    def _fail(self, error: BaseException) -> None:
        self._over = True
        self._out.append(Fail(error))


def _flagged(step: Step) -> bool:
    return step.kind is StepKind.PERCEPTION and step.verdict is not None and step.verdict.unfaithful


def _residual(step: Step, reason: str) -> None:
    step.residual = True
    step.residual_reason = reason


def _leading(raw: str, text: str) -> str:
    """The whitespace/tags before a step's text inside its raw span."""
    at = raw.rfind(text)
    return raw[:at] if at >= 0 else raw[: len(raw) - len(raw.lstrip())]


def _message(error: BaseException | None) -> str | None:
    return None if error is None else getattr(error, "message", None) or str(error)
