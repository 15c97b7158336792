"""The machine's phase, and the table of what moves it: nothing else decides what may happen next.

    READING       a round (or a kept step's read-ahead) is being read; nothing is in flight
    CHECKING      a batch of new steps is with the detector
    REGENERATING  a flagged step is with the regenerator
    RECHECKING    a rewritten candidate is with the detector
    OVER          the chain ended or failed; nothing follows

Whether an upstream stream is open, and whether the round has ended or broken, are facts about the round
(machine.py), not phases: a round reads on while its steps are checked.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    READING = "reading"
    CHECKING = "checking"
    REGENERATING = "regenerating"
    RECHECKING = "rechecking"
    OVER = "over"


class Trigger(enum.Enum):
    CHECK = "check"  # a batch goes to the detector
    CHECKED = "checked"  # its verdicts came back
    REGENERATE = "regenerate"  # a flagged step goes to the regenerator (also the next try)
    REGENERATED = "regenerated"  # a candidate came back: re-check it
    SETTLED = "settled"  # the step under correction is rewritten or kept: read on
    FINISH = "finish"  # the chain ended, or failed


_R, _C, _G, _K, _O = Phase.READING, Phase.CHECKING, Phase.REGENERATING, Phase.RECHECKING, Phase.OVER

TRANSITIONS: dict[tuple[Phase, Trigger], Phase] = {
    (_R, Trigger.CHECK): _C,
    (_C, Trigger.CHECKED): _R,
    (_R, Trigger.REGENERATE): _G,  # a flagged step in a checked batch
    (_G, Trigger.REGENERATED): _K,
    (_G, Trigger.REGENERATE): _G,  # nothing usable came back: the next try goes out at once
    (_G, Trigger.SETTLED): _R,  # tries used up: the original is kept
    (_K, Trigger.REGENERATE): _G,  # the candidate was still unfaithful
    (_K, Trigger.SETTLED): _R,  # rewritten, or tries used up
    (_R, Trigger.FINISH): _O,
    (_C, Trigger.FINISH): _O,  # a detector error under on-detector-error=fail, a detect-mode upstream failure
    (_G, Trigger.FINISH): _O,
    (_K, Trigger.FINISH): _O,
}


def advance(phase: Phase, trigger: Trigger) -> Phase:
    """The phase `trigger` leads to from `phase`; RuntimeError when the table has no such move (a result
    nobody asked for, an event after the end)."""
    try:
        return TRANSITIONS[phase, trigger]
    except KeyError:
        raise RuntimeError(f"{trigger.value} is not possible while {phase.value}") from None
