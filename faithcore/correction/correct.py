"""correct mode: check while reading, rewrite the first unfaithful step, continue after it.

Per round: every step read so far (at most max_batch_steps) is checked as one batch while the round
reads on; faithful and reasoning steps are emitted in order; at the first unfaithful perception step the
round is dropped (vLLM stops decoding), the step is regenerated up to K times, each candidate re-checked,
and a new round continues from the accepted text. After K failed tries the ORIGINAL step is kept (the
model's own text; no candidate was better by the detector's standard), residual, and decoding goes on
after it: the dropped round's read-ahead continued exactly that prefix, so what it read (whole steps,
then the newlines and tags past the last: RoundParser.read_past_last_step) is checked and delivered as if
the round had never stopped, and the new round starts after it (or none starts, when the round had
ended). A rewrite makes the read-ahead stale: it goes. Steps before an upstream failure are still
delivered; the failure comes after them. With `Rules.sequential` the round is also stopped after every
checked step (the pipelining benchmark's baseline).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from faithproxy.faithcore.correction.actions import (
    Check,
    EmitExtra,
    EmitText,
    Regenerate,
    RegenerationNote,
    StartRound,
    TryOutcome,
)
from faithproxy.faithcore.correction.events import Checked, Extras, Regenerated, RoundEnd
from faithproxy.faithcore.correction.machine import ChainMachine, Item, _flagged, _message, _residual, _unreached
from faithproxy.faithcore.correction.phase import Phase, Trigger, advance
from faithproxy.faithcore.correction.rounds import TrailingRaw
from faithproxy.faithcore.correction.rules import Rules
from faithproxy.faithcore.types import Channel, Faithfulness, Step, Verdict


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


class CorrectMachine(ChainMachine):
    """correct mode; see the module docstring."""

    def __init__(self, rules: Rules) -> None:
        self._pending: deque[Item] = deque()  # items waiting for their batch
        # the raw text per channel the client has received: where a new round continues from
        self._accepted_raw = {Channel.REASONING: "", Channel.CONTENT: ""}
        self._fix: _Fix | None = None  # the step being regenerated
        super().__init__(rules)

    # ---- reading and batches ------------------------------------------------------------------

    def _on_item(self, item: Item) -> None:
        self._pending.append(item)  # steps, trailing raw and extras, in order

    def _decide(self) -> None:
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

    def _on_verdicts(self, batch: list[Item], steps: list[Step]) -> None:
        self._emit_batch(batch)

    def _emit_batch(self, batch: list[Item]) -> None:
        """Emits a checked batch in order, up to its first unfaithful step if that one is to be
        regenerated (the rest of the round is dropped then)."""
        steps = [i for i in batch if isinstance(i, Step)]
        cut = _unreached(steps)
        for pos, item in enumerate(batch):
            if isinstance(item, Step) and _flagged(item):
                if self._may_regenerate():
                    read = [*batch[pos + 1 :], *self._pending, *self._read_past_last_step()]
                    self._start_fix(item, _ReadAhead(read, self._end))
                    return
                _residual(item, "not_corrected")
            self._emit_item(item)
            if cut < len(steps) and item is steps[cut - 1]:
                # A flag that stays (unsure, or no regeneration left) keeps the steps after it, which the
                # detector did not reach: back in line, checked next with the flagged step as context.
                for step in steps[cut:]:
                    step.verdict = step.first_verdict = None
                self._pending.extendleft(reversed(batch[pos + 1 :]))
                return
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

    # ---- regeneration -----------------------------------------------------------------------

    def _may_regenerate(self) -> bool:
        rules = self.rules
        return rules.max_retries > 0 and self._regenerations < rules.max_regenerations

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
            self._out.append(RegenerationNote(fix.step, fix.attempt, TryOutcome.INSISTED))
            _residual(fix.step, "insisted")
            self._fixed()
            return
        if result.error is not None or result.candidate is None:
            outcome = TryOutcome.ERROR if result.error is not None else TryOutcome.UNPARSEABLE
            self._out.append(RegenerationNote(fix.step, fix.attempt, outcome))
            self._next_try()
            return
        self.phase = advance(self.phase, Trigger.REGENERATED)
        fix.candidate = text = result.candidate
        trial = Step(index=fix.step.index, text=text, raw=text, channel=fix.step.channel, kind=fix.step.kind)
        self._out.append(Check([trial], candidate=True, accepted=tuple(self._accepted)))

    def _on_recheck(self, checked: Checked) -> None:
        """The verdict on a regenerated candidate."""
        fix = self._fix
        assert fix is not None and fix.candidate is not None
        step, candidate = fix.step, fix.candidate
        if checked.error is not None and not self._passes(checked.error):
            self._fail(checked.error)
            return
        verdict = checked.verdicts[0] if checked.verdicts else None
        if verdict is not None and verdict.unfaithful:
            step.rejected.append(candidate)
            self._out.append(RegenerationNote(step, fix.attempt, TryOutcome.STILL_UNFAITHFUL))
            self._next_try()
            return
        self._out.append(RegenerationNote(step, fix.attempt, TryOutcome.FIXED))
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
        prefix = dict(self._accepted_raw)
        for item in items:
            assert isinstance(item, Step | TrailingRaw)
            prefix[item.channel] += item.raw
            if isinstance(item, Step):
                _forget_verdict(item)
        self._pending.extend(items)
        if read_ahead.end is not None:  # the round had ended: what it read is the rest of the chain
            self._end = read_ahead.end
            return True
        # the bridge goes in line after the read-ahead; a spent budget ends the chain once it is out
        if not self._continue_from(prefix, lambda channel, text: self._pending.append(TrailingRaw(channel, text))):
            self._end = RoundEnd("length", None)
        return True

    # ---- rounds -----------------------------------------------------------------------------

    def _continue(self) -> None:
        """A round that continues from the accepted text (the bridge emitted first, as the model's own),
        or the end when the budget is spent."""
        if not self._continue_from(self._accepted_raw, self._emit_bridge):
            self._finish("length")

    def _emit_bridge(self, channel: Channel, text: str) -> None:
        self._out.append(EmitText(channel, self._field(channel), text))

    def _resume_round(self) -> None:
        """Every step the round read in whole was checked and delivered by now (a step rewritten among
        them drops the broken round and continues anyway); the newlines and tags it read past the last of
        them go out too. The sentence it was cutting is gone: the new round writes it again."""
        if not self._steps and not any(self._accepted_raw.values()):
            self._drop_round()  # nothing accepted yet: the first round again, as the client sent it
            self._start_round(StartRound())
            return
        for item in self._read_past_last_step():  # e.g. the "\n</think>\n\n" after the last step
            self._emit_item(item)
        self._drop_round()
        self._continue()

    def _drop_round(self) -> None:
        self._pending.clear()  # the round's read-ahead goes with it
        super()._drop_round()


def _forget_verdict(step: Step) -> None:
    """A read-ahead step goes back in line to be checked again: its verdict came with the batch that
    flagged the step before it, and its detector typing went with that verdict, so the judge gate and the
    next detector see the step as the typer read it (one retyped as reasoning was gated here)."""
    step.verdict = step.first_verdict = None
    step.unchecked_reason = None
    step.kind, step.typed_kind = step.typed_kind or step.kind, None


def _leading(raw: str, text: str) -> str:
    """The whitespace/tags before a step's text inside its raw span."""
    at = raw.rfind(text)
    return raw[:at] if at >= 0 else raw[: len(raw) - len(raw.lstrip())]
