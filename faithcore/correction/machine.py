"""The correction machine: one request's chain, from upstream deltas to settled steps.

Like h11, it is told what happened and says what to do; it never waits, reads a socket or counts a
metric. `receive(event)` takes upstream data of the current round (events.py) or the result of an action;
`next_action()` returns what to do now (actions.py), or WAIT when it needs the next event. Its phase
(phase.py) says what is in flight; the transition table refuses a result nobody asked for.

correct mode, per round:
  every step read so far (at most max_batch_steps) is checked as one batch while the round reads on;
  faithful and reasoning steps are emitted in order; at the first unfaithful perception step the round
  is dropped (vLLM stops decoding), the step is regenerated up to K times, each candidate re-checked,
  and a new round continues from the accepted text. After K failed tries the ORIGINAL step is kept (the
  model's own text; no candidate was better by the detector's standard), residual, and decoding goes on
  after it: the dropped round's read-ahead continued exactly that prefix, so what it read (whole steps,
  then the newlines and tags past the last: RoundParser.read_past_last_step) is checked and delivered as
  if the round had never stopped, and the new round starts after it (or none starts, when the round had
  ended). A rewrite makes the read-ahead stale: it goes. Steps before
  an upstream failure are still delivered; the failure comes after them. With `Rules.sequential` the
  round is also stopped after every checked step (the pipelining benchmark's baseline).
detect mode:
  text is emitted as it arrives, steps are checked in batches one call at a time, and their verdicts
  follow in EmitVerdicts; nothing is rewritten, an unfaithful step is residual (not corrected).

The machine owns each step's outcome (verdict, residual and its reason, unchecked and its reason), its
number, the regeneration budget of the request and the completion-token budget across rounds. A step
leaves it in an EmitText (correct mode) or an EmitVerdicts (detect mode) with its outcome final: that is
when the driver counts it. `result()` is the immutable record of the chain.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import MappingProxyType

from faithproxy.faithcore.context import Usage
from faithproxy.faithcore.correction.actions import (
    WAIT,
    Action,
    Check,
    DropRound,
    EmitEnd,
    EmitExtra,
    EmitText,
    EmitVerdicts,
    Fail,
    Regenerate,
    Resumed,
    StartRound,
    Tried,
)
from faithproxy.faithcore.correction.events import (
    Checked,
    Delta,
    Event,
    Extras,
    Regenerated,
    RoundEnd,
    RoundFailed,
)
from faithproxy.faithcore.correction.phase import Phase, Trigger, advance
from faithproxy.faithcore.correction.result import ChainResult
from faithproxy.faithcore.correction.rounds import RoundParser, TrailingRaw
from faithproxy.faithcore.correction.rules import Rules
from faithproxy.faithcore.errors import DetectorError, UpstreamError, UpstreamErrorCode, UpstreamStatusError
from faithproxy.faithcore.types import Channel, Faithfulness, Step, StepKind, Verdict

# What a round holds in line for its batches: steps, the raw text between them, extras, in order.
Item = Step | TrailingRaw | Extras
# How a stream breaks after its first byte: the replica died or a proxy cut it (reset, EOF without
# [DONE]), or it fell silent past the idle limit. Not a bad request, not a malformed chunk: those would
# fail the same way again.
_BREAKS = frozenset({UpstreamErrorCode.STREAM_BROKEN, UpstreamErrorCode.STREAM_TRUNCATED, UpstreamErrorCode.STALLED})
# What a router answers for a backend it cannot reach. vllm-router also answers 500 for one ("Request
# failed: error sending request for url ...", plain text): a 500 refuses as a gateway when its body is
# not the JSON error object vLLM writes for its own errors (those would fail the same way again).
_GATEWAY_STATUSES = frozenset({502, 503, 504})


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
    """The state of one request's chain; see the module docstring."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.phase = Phase.READING
        self.budget = CompletionBudget(rules.completion_budget)
        self._detect = rules.mode == "detect"
        self._steps: list[Step] = []  # every step emitted, in order
        self._accepted: list[Step] = []  # the steps a detector may treat as context
        self._usage = Usage()
        self._regenerations = 0  # regeneration tries over the whole request
        self._rounds = 0
        self._resumes = 0  # rounds started after an upstream break
        # detect mode: the text each channel sent the client, where a resumed round continues from
        self._sent: dict[Channel, list[str]] = {Channel.REASONING: [], Channel.CONTENT: []}
        self._upstream_id: str | None = None
        self._field_names: dict[Channel, str] = {}  # the delta field of each channel
        self._out: deque[Action] = deque()
        self._accepted_raw = {Channel.REASONING: "", Channel.CONTENT: ""}
        # the round being read; its parser is None while no upstream stream is open
        self._parser: RoundParser | None = None
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
            if self.phase is Phase.OVER:
                raise RuntimeError("the chain is over: nothing more to do")
            if self.phase is Phase.READING:
                self._decide()
        return self._out.popleft() if self._out else WAIT

    def receive(self, event: Event) -> bool:
        """Takes `event`; True when it may have given the driver something to do (a step completed, the
        round ended, a result came back), False for what only waits for more (most text deltas)."""
        if self.phase is Phase.OVER:
            return False  # a late result after a failure: nothing depends on it any more
        if type(event) is Delta:
            return self._on_delta(event)
        if isinstance(event, Checked):
            self._on_checked(event)
        elif isinstance(event, Regenerated):
            self._on_regenerated(event)
        elif self._parser is None:
            return False  # an event of a dropped round, read before the drop took effect
        elif isinstance(event, RoundEnd):
            self._on_round_end(event)
        elif isinstance(event, RoundFailed):
            self._on_round_failed(event)
        else:
            self._on_item(event)
        return True

    @property
    def round(self) -> int:
        """The number of the current round (from 1): a driver feeds a round's events only while it is."""
        return self._rounds

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps the client has received so far, in order."""
        return tuple(self._steps)

    def result(self) -> ChainResult:
        return ChainResult(
            steps=tuple(self._steps),
            usage=MappingProxyType(self._usage.as_dict()),
            regenerations=self._regenerations,
            rounds=self._rounds,
            upstream_id=self._upstream_id,
            field_names=MappingProxyType(dict(self._field_names)),
            resumes=self._resumes,
        )

    # ---- upstream data ----------------------------------------------------------------------

    def _on_delta(self, delta: Delta) -> bool:
        parser = self._parser
        mapped = parser.channel_of(delta.field) if parser is not None else None
        if mapped is None:
            return False  # a dropped round's, or a field that carries no text
        assert parser is not None
        field, channel = mapped
        self._deltas += 1
        self._field_names.setdefault(channel, field)
        if self._detect:
            self._sent[channel].append(delta.text)
            self._out.append(EmitText(channel, field, delta.text))
        items = parser.feed(channel, delta.text)
        for item in items:
            self._on_item(item)
        return self._detect or bool(items)

    def _on_item(self, item: Item) -> None:
        if not self._detect:
            self._pending.append(item)  # steps, trailing raw and extras, in order
        elif isinstance(item, Step):
            self._number(item)
            self._to_check.append(item)
        elif isinstance(item, Extras):
            self._out.append(EmitExtra(item.delta))
        # detect mode drops TrailingRaw: its text went out with its delta

    def _on_round_end(self, end: RoundEnd) -> None:
        assert self._parser is not None
        for item in self._parser.end():
            self._on_item(item)
        self._end = end
        if end.upstream_id and self._upstream_id is None:
            self._upstream_id = end.upstream_id
        self._tally_round()

    def _on_round_failed(self, failure: RoundFailed) -> None:
        self._failure = failure
        if self._detect and not self._resume(failure):
            self._fail(failure.error)  # the text already went out: nothing left to deliver first

    def _tally_round(self) -> None:
        """Adds the round's completion tokens to the request's usage and budget, once: vLLM's count when
        the round ended, else an estimate (an aborted round reports no usage; vLLM streams about one token
        per text delta)."""
        if self._tallied:
            return
        self._tallied = True
        if self._end is not None:
            self._usage.add(self._end.usage)
            self.budget.used += int((self._end.usage or {}).get("completion_tokens") or 0)
        else:
            self._usage.completion_tokens += self._deltas
            self.budget.used += self._deltas

    # ---- decisions (READING only) -----------------------------------------------------------

    def _decide(self) -> None:
        if self._detect:
            self._decide_detect()
            return
        while self._pending and self.phase is Phase.READING:
            self._take_batch()
        if self._pending or self._out or self.phase is not Phase.READING:
            return
        if self._failure is not None:
            if not self._resume(self._failure):
                self._fail(self._failure.error)
        elif self._end is not None:
            self._finish(self._end.finish_reason)

    def _take_batch(self) -> None:
        """The next items up to the batch limit of steps (with the non-step items between and after them):
        checked in one call when there is something to check, emitted at once otherwise."""
        batch: list[Item] = []
        steps = 0
        while self._pending:
            if isinstance(self._pending[0], Step):
                if steps == self.rules.batch_limit:
                    break
                steps += 1
            batch.append(self._pending.popleft())
        new_steps = [i for i in batch if isinstance(i, Step)]
        if self._worth_checking(new_steps):
            self._ask_check(batch, new_steps)
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

    def _ask_check(self, batch: list[Item], steps: list[Step]) -> None:
        self.phase = advance(self.phase, Trigger.CHECK)
        self._batch = batch
        self._out.append(Check(steps, accepted=tuple(self._accepted)))

    def _decide_detect(self) -> None:
        limit = self.rules.batch_limit
        while self._to_check and self.phase is Phase.READING:
            batch, self._to_check = self._to_check[:limit], self._to_check[limit:]
            if self._worth_checking(batch):
                self._ask_check(list(batch), batch)
            else:
                self._settle_verdicts(batch)
        if self._end is not None and self.phase is Phase.READING and not self._to_check and not self._out:
            self._finish(self._end.finish_reason)

    # ---- verdicts ---------------------------------------------------------------------------

    def _on_checked(self, checked: Checked) -> None:
        if checked.usage is not None:
            self._usage.add(checked.usage.as_dict())
        if self.phase is Phase.RECHECKING:
            self._on_candidate_checked(checked)
            return
        self.phase = advance(self.phase, Trigger.CHECKED)  # RuntimeError when no check was asked for
        batch, self._batch = self._batch, None
        assert batch is not None
        steps = [i for i in batch if isinstance(i, Step)]
        _keep_features(steps, checked.features)
        if not self._apply(steps, checked):
            return
        if self._detect:
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
        self._accepted.extend(steps)
        self._out.append(EmitVerdicts(tuple(steps)))

    def _emit_batch(self, batch: list[Item]) -> None:
        """correct mode: emits a checked batch in order, up to its first unfaithful step if that one is
        to be regenerated (the rest of the round is dropped then)."""
        for pos, item in enumerate(batch):
            if isinstance(item, Step) and _flagged(item):
                if self._may_regenerate():
                    read = [*batch[pos + 1 :], *self._pending, *self._read_past_last_step()]
                    self._start_fix(item, _ReadAhead(read, self._end))
                    return
                _residual(item, "not_corrected")
            self._emit_item(item)
        if self.rules.sequential and self._end is None and any(isinstance(i, Step) for i in batch):
            self._drop_round()  # the model is still decoding: stop it, and continue in a new round
            self._continue()

    def _emit_item(self, item: Item) -> None:
        if isinstance(item, Step):
            self._accept(item)
        elif isinstance(item, TrailingRaw):
            self._accepted_raw[item.channel] += item.raw
            self._out.append(EmitText(item.channel, self._field(item.channel), item.raw))
        else:
            self._out.append(EmitExtra(item.delta))

    def _accept(self, step: Step) -> None:
        self._settle(step)
        self._accepted_raw[step.channel] += step.raw
        self._number(step)
        self._accepted.append(step)
        self._out.append(EmitText(step.channel, self._field(step.channel), step.raw, step))

    def _number(self, step: Step) -> None:
        """A step's number is its place among the steps the client received: given once, here."""
        step.index = len(self._steps)
        self._steps.append(step)

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
        return self._field_names.get(channel) or ("content" if channel is Channel.CONTENT else "reasoning")

    # ---- regeneration -----------------------------------------------------------------------

    def _may_regenerate(self) -> bool:
        rules = self.rules
        return rules.mode == "correct" and rules.max_retries > 0 and self._regenerations < rules.max_regenerations

    def _start_fix(self, step: Step, read_ahead: _ReadAhead) -> None:
        self._drop_round()
        self._fix = _Fix(step, prefix=[s.text for s in self._steps], read_ahead=read_ahead)
        self._next_try()

    def _next_try(self) -> None:
        fix = self._fix
        assert fix is not None
        fix.candidate = None
        if fix.attempt >= self.rules.max_retries or self._regenerations >= self.rules.max_regenerations:
            _residual(fix.step, "regeneration_failed")  # the ORIGINAL text stays
            self._fixed()
            return
        self.phase = advance(self.phase, Trigger.REGENERATE)
        fix.attempt += 1
        fix.step.attempts = fix.attempt
        self._regenerations += 1
        self._out.append(Regenerate(fix.step, fix.prefix, fix.attempt, accepted=tuple(self._accepted)))

    def _on_regenerated(self, result: Regenerated) -> None:
        fix = self._fix
        if fix is None or self.phase is not Phase.REGENERATING:
            raise RuntimeError("a regeneration result arrived, but no regeneration was asked for")
        if result.usage is not None:
            self._usage.add(result.usage.as_dict())
        if result.insisted:  # the model restates the flagged step: it is kept, no further try is spent
            self._out.append(Tried(fix.step, fix.attempt, "insisted"))
            _residual(fix.step, "insisted")
            self._fixed()
            return
        if result.error is not None or result.candidate is None:
            self._out.append(Tried(fix.step, fix.attempt, "error" if result.error is not None else "unparseable"))
            self._next_try()
            return
        self.phase = advance(self.phase, Trigger.REGENERATED)
        fix.candidate = text = result.candidate
        trial = Step(index=fix.step.index, text=text, raw=text, channel=fix.step.channel, kind=fix.step.kind)
        self._out.append(Check([trial], candidate=True, accepted=tuple(self._accepted)))

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
            self._rewrite_unchecked(step, verdict, checked.error)
        else:
            step.verdict = verdict
        self._fixed()

    def _rewrite_unchecked(self, step: Step, verdict: Verdict | None, error: BaseException | None) -> None:
        """The rewrite went out unchecked: residual, like any perception step without a verdict."""
        step.verdict = verdict or Verdict(Faithfulness.UNKNOWN, self.rules.detector, reason=_message(error))
        step.unchecked_reason = "detector_error" if error is not None else self._unknown_reason()
        if verdict is not None and verdict.unchecked:
            step.unchecked_reason = verdict.unchecked
        _residual(step, "unchecked")

    def _fixed(self) -> None:
        """The step under regeneration is settled (rewritten or kept): emit it, continue after it."""
        fix, self._fix = self._fix, None
        assert fix is not None
        self.phase = advance(self.phase, Trigger.SETTLED)
        self._accept(fix.step)
        if fix.step.original_text is None and fix.read_ahead is not None and self._resume_read_ahead(fix.read_ahead):
            return
        self._continue()

    def _resume_read_ahead(self, read_ahead: _ReadAhead) -> bool:
        """After a kept step: the read-ahead goes back in line and decoding resumes after it. False
        (nothing changed) when it cannot: a non-text delta in it, which a continuation cannot carry.

        Its steps are checked again, in batches as they come: the verdicts they got came with the batch
        that flagged the step before them, and a judge that stops at the first unfaithful sentence
        leaves the ones after it unknown. The template's bridge (a think block it would close) goes
        after the read-ahead, as it would after any accepted text."""
        items = read_ahead.items
        if any(isinstance(item, Extras) for item in items):
            return False
        raw = dict(self._accepted_raw)
        for item in items:
            assert isinstance(item, Step | TrailingRaw)
            raw[item.channel] += item.raw
            if isinstance(item, Step):
                _forget_verdict(item)
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

    # ---- resuming after an upstream break ------------------------------------------------------

    def _resume(self, failure: RoundFailed) -> bool:
        """A round whose stream broke is continued, not failed: a new round (through the same
        upstream, where a router picks a live replica) continues from what the client already has, with
        the continuation a rewrite uses. correct mode gets here once every step the round read in whole
        was checked and delivered (a step rewritten among them drops the broken round and continues
        anyway), and the newlines and tags it read past the last of them go out too; the sentence it
        was cutting is gone, and the new round writes it again. detect mode
        already sent the round's text as it came: the new round continues from exactly that text, through
        the same step parser, so the cut sentence is completed and checked as one step.

        A round refused before its first byte (unreachable, 502/503/504: a router whose replica just
        died) is sent again the same way, the first round included (the client has nothing yet).

        At most `resume_attempts` per request; False (the request fails as before) when the failure is
        neither, and when none is left."""
        if not self._resumable(failure.error):
            return False
        if self._resumes >= self.rules.resume_attempts:
            if self.rules.resume_attempts:
                self._out.append(Resumed(self._resumes + 1, "exhausted", failure.error))
            return False
        self._resumes += 1
        self._out.append(Resumed(self._resumes, "resumed", failure.error))
        if self._detect:
            self._resume_detect()
        elif not self._steps and not any(self._accepted_raw.values()):
            self._drop_round()  # nothing accepted yet: the first round again, as the client sent it
            self._start_round(StartRound())
        else:
            for item in self._read_past_last_step():  # e.g. the "\n</think>\n\n" after the last step
                self._emit_item(item)
            self._drop_round()
            self._continue()
        return True

    def _resumable(self, error: BaseException) -> bool:
        """A break of the stream, after its headers (a round killed in its prefill has sent no text yet,
        and the client none of it either), and a round refused before its first byte by an unreachable
        upstream or a gateway error: a router that has not yet noticed a dead replica answers so, and a
        later attempt gets past it."""
        if not isinstance(error, UpstreamError):
            return False
        return error.code in _BREAKS or (self._deltas == 0 and _refused(error))

    def _resume_detect(self) -> None:
        parser = self._parser
        assert parser is not None
        self._drop_round()
        sent = {channel: "".join(parts) for channel, parts in self._sent.items()}
        if not any(sent.values()):  # nothing went out: the request starts over
            self._start_round(StartRound())
            return
        remaining = self.budget.remaining()
        if remaining is not None and remaining <= 0:  # the broken round spent the budget: it ends here
            for item in parser.end():
                self._on_item(item)
            self._end = RoundEnd("length", None)
            return
        continuation = self.rules.reasoning_format.continuation(sent)
        for channel, text in continuation.bridge.items():  # the closed think block goes out as text
            sent[channel] += text
            self._sent[channel].append(text)
            self._out.append(EmitText(channel, self._field(channel), text))
            for item in parser.feed(channel, text):
                self._on_item(item)
        parser.in_answer = continuation.in_answer
        self._start_round(StartRound(sent, remaining, continuation), parser)

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

    def _start_round(self, start: StartRound | None, parser: RoundParser | None = None) -> None:
        """`parser`: the broken round's, kept by a detect-mode resume (its cut sentence goes on)."""
        self._rounds += 1
        in_answer = start is not None and start.continuation is not None and start.continuation.in_answer
        rules = self.rules
        self._parser = parser or RoundParser(
            lambda: rules.segmenter(tags=rules.reasoning_format.tags), rules.typer, in_answer=in_answer
        )
        self._end, self._failure, self._deltas, self._tallied = None, None, 0, False
        self._out.append(start or StartRound())

    def _read_past_last_step(self) -> list[TrailingRaw]:
        """The open round's whitespace and tags after its last whole step, which a round continuing
        after that step keeps (RoundParser.read_past_last_step says why); none once it has ended."""
        return self._parser.read_past_last_step() if self._parser is not None else []

    def _drop_round(self) -> None:
        self._tally_round()
        self._pending.clear()
        self._failure = None  # the dropped round's failure no longer matters: a new round follows
        if self._parser is not None:  # none is open when the read-ahead of an ended round was resumed
            self._parser = None
            self._out.append(DropRound())

    def _finish(self, finish_reason: str | None) -> None:
        self.phase = advance(self.phase, Trigger.FINISH)
        self._out.append(EmitEnd(finish_reason))

    def _fail(self, error: BaseException) -> None:
        self.phase = advance(self.phase, Trigger.FINISH)
        self._out.append(Fail(error))


def _refused(error: UpstreamError) -> bool:
    if isinstance(error, UpstreamStatusError):
        return error.status_code in _GATEWAY_STATUSES or (error.status_code == 500 and not isinstance(error.body, dict))
    return error.code == UpstreamErrorCode.CONNECT


def _flagged(step: Step) -> bool:
    """A perception step judged UNFAITHFUL. An UNSURE verdict (a flag under the judge's threshold) is not
    one: the step is delivered as it is, never rewritten."""
    return step.kind is StepKind.PERCEPTION and step.verdict is not None and step.verdict.unfaithful


def _residual(step: Step, reason: str) -> None:
    step.residual = True
    step.residual_reason = reason


def _forget_verdict(step: Step) -> None:
    """A read-ahead step goes back in line to be checked again: its verdict came with the batch that
    flagged the step before it, and its detector typing went with that verdict, so the judge gate and the
    next detector see the step as the typer read it (one retyped as reasoning was gated here)."""
    step.verdict = step.first_verdict = None
    step.unchecked_reason = None
    step.kind, step.typed_kind = step.typed_kind or step.kind, None


def _keep_features(steps: list[Step], features: tuple[object, ...] | None) -> None:
    """Hidden-state features read beside a check belong to the steps' original text (traces keep them)."""
    if features is None:
        return
    for step, feature in zip(steps, features, strict=False):
        if feature is not None and step.features is None:
            step.features = feature


def _leading(raw: str, text: str) -> str:
    """The whitespace/tags before a step's text inside its raw span."""
    at = raw.rfind(text)
    return raw[:at] if at >= 0 else raw[: len(raw) - len(raw.lstrip())]


def _message(error: BaseException | None) -> str | None:
    return None if error is None else getattr(error, "message", None) or str(error)
