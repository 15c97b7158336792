"""The correction machine: the paper's Algorithm 2 as a sans-IO state machine (like h11).

A door's driver feeds it upstream data (`Delta`, `Extras`, `RoundEnd`, `RoundFailed`: text and the field
it came in, nothing parsed) and the results of what it asked for (`Checked`, `Regenerated`); it answers
with one action at a time (`next_action`). It segments, types and numbers steps itself, decides every
step's outcome and keeps the request's usage; it imports no I/O and writes into nothing it was given.

    events.py   what the machine is told        actions.py  what it asks for
    rounds.py   one upstream round: deltas → steps (segmenter, step typer)
    phase.py    the explicit phase and its transition table
    rules.py    the rules of one request
    machine.py  what both modes share (ChainMachine): rounds, budget, checks, outcomes, the continuation
    correct.py  correct mode's story (CorrectMachine)   detect.py  detect mode's (DetectMachine)
    result.py   the immutable record of a finished (or failed) chain
    wire.py     an OpenAI chat-completions chunk as events (one wire format; other doors add theirs)
"""

from faithproxy.faithcore.correction.actions import (
    WAIT,
    Action,
    Check,
    DropRound,
    Emit,
    EmitEnd,
    EmitExtra,
    EmitText,
    EmitVerdicts,
    Fail,
    Note,
    Regenerate,
    RegenerationNote,
    ResumeNote,
    ResumeOutcome,
    StartRound,
    TryOutcome,
)
from faithproxy.faithcore.correction.correct import CorrectMachine
from faithproxy.faithcore.correction.detect import DetectMachine
from faithproxy.faithcore.correction.events import (
    Checked,
    Delta,
    Event,
    Extras,
    Regenerated,
    RoundEnd,
    RoundFailed,
)
from faithproxy.faithcore.correction.machine import ChainMachine
from faithproxy.faithcore.correction.phase import Phase
from faithproxy.faithcore.correction.result import ChainResult
from faithproxy.faithcore.correction.rules import Rules

__all__ = [
    "WAIT",
    "Action",
    "ChainResult",
    "Check",
    "Checked",
    "ChainMachine",
    "CorrectMachine",
    "DetectMachine",
    "Delta",
    "DropRound",
    "Emit",
    "EmitEnd",
    "EmitExtra",
    "EmitText",
    "EmitVerdicts",
    "Event",
    "Extras",
    "Fail",
    "Phase",
    "Regenerate",
    "Regenerated",
    "Note",
    "RegenerationNote",
    "ResumeNote",
    "ResumeOutcome",
    "RoundEnd",
    "RoundFailed",
    "Rules",
    "StartRound",
    "TryOutcome",
    "new_machine",
]


def new_machine(rules: Rules) -> ChainMachine:
    """The machine of one request, in its mode's story."""
    return DetectMachine(rules) if rules.mode == "detect" else CorrectMachine(rules)
