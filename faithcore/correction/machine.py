"""The correction machine's shared part: one request's chain, from upstream deltas to settled steps.

Like h11, it is told what happened and says what to do; it never waits, reads a socket or counts a
metric. `receive(event)` takes upstream data of the current round (events.py) or the result of an action;
`next_action()` returns what to do now (actions.py), or WAIT when it needs the next event. Its phase
(phase.py) says what is in flight; the transition table refuses a result nobody asked for.

`ChainMachine` holds what both modes share: rounds and their parser, the budget and usage, the steps'
numbers and outcomes, the check of a batch and its verdicts, the resume after an upstream break, and the
one continuation (`_continue_from`: what a new round starts from, the template's bridge, the budget).
Each mode tells its own story over it: correct.py (`CorrectMachine`: check while reading, rewrite the
first unfaithful step, continue after it) and detect.py (`DetectMachine`: send as read, verdicts after).
`new_machine(rules)` (in this package's __init__) picks one.

The machine owns each step's outcome (verdict, residual and its reason, unchecked and its reason), its
number, the regeneration budget of the request and the completion-token budget across rounds. A step
leaves it in an EmitText (correct mode) or an EmitVerdicts (detect mode) with its outcome final: that is
when the driver counts it; until then only the machine writes to it. `result()` is the immutable record of
the chain.
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from faithproxy.faithcore.context import Usage
from faithproxy.faithcore.correction.actions import (
    WAIT,
    Action,
    Check,
    DropRound,
    EmitEnd,
    Fail,
    ResumeNote,
    ResumeOutcome,
    StartRound,
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

    @property
    def spent(self) -> bool:
        remaining = self.remaining()
        return remaining is not None and remaining <= 0


class ChainMachine(abc.ABC):
    """The state of one request's chain; see the module docstring. A mode fills in the hooks below."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.phase = Phase.READING
        self.budget = CompletionBudget(rules.completion_budget)
        self._steps: list[Step] = []  # every step emitted, in order
        self._accepted: list[Step] = []  # the steps a detector may treat as context
        self._usage = Usage()
        self._regenerations = 0  # regeneration tries over the whole request
        self._rounds = 0
        self._resumes = 0  # rounds started after an upstream break
        self._upstream_id: str | None = None
        self._field_names: dict[Channel, str] = {}  # the delta field of each channel
        self._out: deque[Action] = deque()
        # the round being read; its parser is None while no upstream stream is open
        self._parser: RoundParser | None = None
        self._end: RoundEnd | None = None
        self._failure: RoundFailed | None = None
        self._deltas = 0
        self._tallied = False
        self._batch: list[Item] | None = None  # the batch being checked
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
            if event.usage is not None:
                self._usage.add(event.usage.as_dict())
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

    # ---- what a mode decides ------------------------------------------------------------------

    @abc.abstractmethod
    def _on_item(self, item: Item) -> None:
        """A step, the raw text after one, or extras, read from the current round."""

    @abc.abstractmethod
    def _decide(self) -> None:
        """READING: what to do with what was read (ask a check, emit, end, resume or fail)."""

    @abc.abstractmethod
    def _on_verdicts(self, batch: list[Item], steps: list[Step]) -> None:
        """A checked batch whose steps carry their verdicts."""

    @abc.abstractmethod
    def _resume_round(self) -> None:
        """Start the round that continues a broken one (its break is counted already)."""

    def _on_text(self, channel: Channel, field: str, text: str) -> bool:
        """A text delta as read, before the segmenter; True when it gives the driver something to do."""
        return False

    def _on_round_failed(self, failure: RoundFailed) -> None:
        self._failure = failure  # decided on once what was read before it is delivered

    def _on_recheck(self, checked: Checked) -> None:
        raise RuntimeError("a candidate's verdict arrived, but no candidate was checked")

    def _on_regenerated(self, result: Regenerated) -> None:
        raise RuntimeError("a regeneration result arrived, but no regeneration was asked for")

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
        woke = self._on_text(channel, field, delta.text)
        items = parser.feed(channel, delta.text)
        for item in items:
            self._on_item(item)
        return woke or bool(items)

    def _on_round_end(self, end: RoundEnd) -> None:
        assert self._parser is not None
        for item in self._parser.end():
            self._on_item(item)
        self._end = end
        if end.upstream_id and self._upstream_id is None:
            self._upstream_id = end.upstream_id
        self._tally_round()

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

    # ---- checks and verdicts ----------------------------------------------------------------

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

    def _on_checked(self, checked: Checked) -> None:
        if self.phase is Phase.RECHECKING:
            self._on_recheck(checked)
            return
        self.phase = advance(self.phase, Trigger.CHECKED)  # RuntimeError when no check was asked for
        batch, self._batch = self._batch, None
        assert batch is not None
        steps = [i for i in batch if isinstance(i, Step)]
        _keep_features(steps, checked.features)
        if self._apply(steps, checked):
            self._on_verdicts(batch, steps)

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

    # ---- steps leaving the machine ----------------------------------------------------------

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
        return "detector_error" if self.rules.detector_gives_verdicts else "detector_none"

    def _field(self, channel: Channel) -> str:
        return self._field_names.get(channel) or ("content" if channel is Channel.CONTENT else "reasoning")

    # ---- resuming after an upstream break ------------------------------------------------------

    def _resume(self, failure: RoundFailed) -> bool:
        """A round whose stream broke is continued, not failed: a new round (through the same upstream,
        where a router picks a live replica) continues from what the client already has (each mode's
        `_resume_round` says from where). A round refused before its first byte (unreachable,
        502/503/504: a router whose replica just died) is sent again the same way, the first round
        included (the client has nothing yet).

        At most `resume_attempts` per request; False (the failure stands: the request fails) when it is
        neither, and when none is left."""
        if not self._resumable(failure.error):
            return False
        if self._resumes >= self.rules.resume_attempts:
            if self.rules.resume_attempts:
                self._out.append(ResumeNote(self._resumes + 1, ResumeOutcome.EXHAUSTED, failure.error))
            return False
        self._resumes += 1
        self._out.append(ResumeNote(self._resumes, ResumeOutcome.RESUMED, failure.error))
        self._resume_round()
        return True

    def _resumable(self, error: BaseException) -> bool:
        """A break of the stream, after its headers (a round killed in its prefill has sent no text yet,
        and the client none of it either), and a round refused before its first byte by an unreachable
        upstream or a gateway error: a router that has not yet noticed a dead replica answers so, and a
        later attempt gets past it."""
        if not isinstance(error, UpstreamError):
            return False
        return error.code in _BREAKS or (self._deltas == 0 and _refused(error))

    # ---- rounds -----------------------------------------------------------------------------

    def _continue_from(
        self, prefix: dict[Channel, str], bridge: Callable[[Channel, str], None], parser: RoundParser | None = None
    ) -> bool:
        """The one continuation: a new round that writes on after `prefix` (the raw text per channel the
        client has, or will have once what is in line goes out). The text the template puts between
        that prefix and the model's next token (a think block it closes: faithcore.reasoning_formats) is
        the model's own: it is added to `prefix` and handed to `bridge`, which delivers it as the mode
        delivers text. `parser`: a broken round's, kept so that its cut sentence goes on. False, and no
        round, when the completion budget is spent (the caller ends the chain its way)."""
        remaining = self.budget.remaining()
        if remaining is not None and remaining <= 0:
            return False
        continuation = self.rules.reasoning_format.continuation(prefix)
        for channel, text in continuation.bridge.items():
            prefix[channel] += text
            bridge(channel, text)
        if parser is not None:
            parser.in_answer = continuation.in_answer
        self._start_round(StartRound(dict(prefix), remaining, continuation), parser)
        return True

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


def _unreached(steps: list[Step]) -> int:
    """Where the steps a detector did not reach begin: a detector that stops at its first flag (the judge,
    the cascade's probe) answers UNKNOWN for the steps after it. They are still to be checked wherever
    they stay in the chain (detect mode sends them; a flag that is not rewritten keeps them). len(steps)
    when there are none."""
    flags = (Faithfulness.UNFAITHFUL, Faithfulness.UNSURE)
    first = next((i for i, s in enumerate(steps) if s.verdict is not None and s.verdict.faithfulness in flags), None)
    if first is None or first + 1 == len(steps):
        return len(steps)
    rest = steps[first + 1 :]
    asked_again = all(
        s.verdict is None or (s.verdict.faithfulness is Faithfulness.UNKNOWN and not s.verdict.unchecked) for s in rest
    )
    return first + 1 if asked_again else len(steps)


def _residual(step: Step, reason: str) -> None:
    step.residual = True
    step.residual_reason = reason


def _keep_features(steps: list[Step], features: tuple[object, ...] | None) -> None:
    """Hidden-state features read beside a check belong to the steps' original text (traces keep them)."""
    if features is None:
        return
    for step, feature in zip(steps, features, strict=False):
        if feature is not None and step.features is None:
            step.features = feature


def _message(error: BaseException | None) -> str | None:
    return None if error is None else getattr(error, "message", None) or str(error)
