"""detect mode: text goes to the client as it arrives; steps are checked in batches, one call at a time,
and their verdicts follow in EmitVerdicts. Nothing is rewritten: an unfaithful step is residual (not
corrected). A broken round is resumed from exactly the text the client has, through the same step
parser, so the sentence it was cutting is completed and checked as one step.
"""

from __future__ import annotations

from faithproxy.faithcore.correction.actions import EmitExtra, EmitText, EmitVerdicts, StartRound
from faithproxy.faithcore.correction.events import Extras, RoundEnd, RoundFailed
from faithproxy.faithcore.correction.machine import ChainMachine, Item, _flagged, _residual, _unreached
from faithproxy.faithcore.correction.phase import Phase
from faithproxy.faithcore.correction.rules import Rules
from faithproxy.faithcore.types import Channel, Step


class DetectMachine(ChainMachine):
    """detect mode; see the module docstring."""

    def __init__(self, rules: Rules) -> None:
        # the text each channel sent the client, where a resumed round continues from
        self._sent: dict[Channel, list[str]] = {Channel.REASONING: [], Channel.CONTENT: []}
        self._to_check: list[Step] = []  # steps sent, not yet checked
        super().__init__(rules)

    def _on_text(self, channel: Channel, field: str, text: str) -> bool:
        self._sent[channel].append(text)
        self._out.append(EmitText(channel, field, text))
        return True

    def _on_item(self, item: Item) -> None:
        if isinstance(item, Step):
            self._number(item)
            self._to_check.append(item)
        elif isinstance(item, Extras):
            self._out.append(EmitExtra(item.delta))
        # a TrailingRaw is dropped: its text went out with its delta

    def _on_round_failed(self, failure: RoundFailed) -> None:
        self._failure = failure
        if not self._resume(failure):
            self._fail(failure.error)  # the text already went out: nothing left to deliver first

    def _decide(self) -> None:
        limit = self.rules.batch_limit
        while self._to_check and self.phase is Phase.READING:
            batch, self._to_check = self._to_check[:limit], self._to_check[limit:]
            if self._worth_checking(batch):
                self._ask_check(list(batch), batch)
            else:
                self._settle_verdicts(batch)
        if self._end is not None and self.phase is Phase.READING and not self._to_check and not self._out:
            self._finish(self._end.finish_reason)

    def _on_verdicts(self, batch: list[Item], steps: list[Step]) -> None:
        # The steps after a flag that the detector did not reach went out like the others: they are
        # checked next, with the flagged step as context, instead of leaving unchecked.
        cut = _unreached(steps)
        for step in steps[cut:]:
            step.verdict = step.first_verdict = None
        self._to_check[:0] = steps[cut:]
        self._settle_verdicts(steps[:cut])

    def _settle_verdicts(self, steps: list[Step]) -> None:
        """The steps' outcomes are final; their verdicts go to the client."""
        for step in steps:
            if _flagged(step):
                _residual(step, "not_corrected")
            self._settle(step)
        self._accepted.extend(steps)
        self._out.append(EmitVerdicts(tuple(steps)))

    def _resume_round(self) -> None:
        parser = self._parser
        assert parser is not None
        self._drop_round()
        sent = {channel: "".join(parts) for channel, parts in self._sent.items()}
        if not any(sent.values()):  # nothing went out: the request starts over
            self._start_round(StartRound())
            return

        def bridge(channel: Channel, text: str) -> None:  # the closed think block goes out as text
            self._sent[channel].append(text)
            self._out.append(EmitText(channel, self._field(channel), text))
            for item in parser.feed(channel, text):
                self._on_item(item)

        if not self._continue_from(sent, bridge, parser):  # the broken round spent the budget: it ends here
            for item in parser.end():
                self._on_item(item)
            self._end = RoundEnd("length", None)
