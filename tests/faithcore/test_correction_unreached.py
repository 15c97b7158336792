"""Steps a detector did not reach after its flag (the judge stops at its first unfaithful sentence) are
checked again wherever they stay in the chain: a flag that is kept (no regeneration left, or an unsure
flag) in correct mode, every flag in detect mode. Driven at the machine's interface, the whole round read
before the first check is answered (a judge that fell behind gets every step in one batch)."""

from __future__ import annotations

import pytest

from faithproxy.faithcore.correction import Check, Checked, Delta, EmitEnd, Regenerate, RoundEnd, Rules, new_machine
from faithproxy.faithcore.correction.machine import ChainMachine
from faithproxy.faithcore.types import Faithfulness, Verdict

CHAIN = [
    "The image shows a red circle. ",
    "It is on a white background. ",
    "A blue square sits above the circle. ",
    "The circle has a thin black outline. ",
]
FLAGGED = {CHAIN[0].strip(), CHAIN[2].strip()}


def judge(first_flag: Faithfulness):
    """Faithful up to its first flagged step, that one `first_flag`, the rest not reached."""
    asked: list[list[str]] = []

    def check(action: Check) -> Checked:
        asked.append([s.text for s in action.steps])
        verdicts, reached = [], True
        for step in action.steps:
            if not reached:
                verdicts.append(Verdict(Faithfulness.UNKNOWN, "judge", reason="judge:x:not_reached"))
            elif step.text in FLAGGED:
                verdicts.append(Verdict(first_flag, "judge"))
                reached = False
            else:
                verdicts.append(Verdict(Faithfulness.FAITHFUL, "judge"))
        return Checked(verdicts)

    return check, asked


def run(core: ChainMachine, check) -> list[tuple[str, str | None]]:
    core.receive(Delta("reasoning", "".join(CHAIN)))
    core.receive(RoundEnd("stop"))
    while not isinstance(action := core.next_action(), EmitEnd):
        assert not isinstance(action, Regenerate), "no regeneration was allowed"
        if isinstance(action, Check):
            core.receive(check(action))
    return [(s.text, s.first_verdict.faithfulness.value if s.first_verdict else None) for s in core.result().steps]


@pytest.mark.parametrize(
    ("mode", "max_retries", "first_flag"),
    [
        ("detect", 3, Faithfulness.UNFAITHFUL),
        ("correct", 0, Faithfulness.UNFAITHFUL),  # the flag is kept: no regeneration
        ("correct", 3, Faithfulness.UNSURE),  # an unsure flag is delivered as it is
    ],
)
def test_the_steps_after_a_kept_flag_are_checked(mode: str, max_retries: int, first_flag: Faithfulness) -> None:
    check, asked = judge(first_flag)
    steps = run(new_machine(Rules(mode, "judge", max_retries=max_retries)), check)  # type: ignore[arg-type]
    flag = first_flag.value
    assert steps == [(CHAIN[0].strip(), flag), (CHAIN[1].strip(), "faithful"), (CHAIN[2].strip(), flag),
                     (CHAIN[3].strip(), "faithful")]  # fmt: skip
    # one batch, then what the first flag left, then what the second left
    assert asked == [[c.strip() for c in CHAIN], [c.strip() for c in CHAIN[1:]], [CHAIN[3].strip()]]
