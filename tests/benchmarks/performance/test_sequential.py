"""The strictly sequential variant of the loop (the pipeline benchmark's baseline): one step per
upstream request, each checked before the model goes on."""

from __future__ import annotations

from faithproxy.benchmarks.performance.sequential import SequentialCore
from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.types import Channel, Faithfulness, Step, StepKind, Verdict
from faithproxy.server.correction import (
    WAIT,
    Check,
    Checked,
    DropRound,
    EmitEnd,
    EmitText,
    Rules,
    StartRound,
)
from faithproxy.server.reader import RoundEnd, TextDelta


def step(text: str) -> Step:
    return Step(index=0, text=text, raw=" " + text, channel=Channel.CONTENT, kind=StepKind.PERCEPTION)


def faithful() -> Checked:
    return Checked([Verdict(Faithfulness.FAITHFUL, "judge")])


def actions(core: SequentialCore) -> list[str]:
    out = []
    while (action := core.next_action()) is not WAIT:
        if isinstance(action, StartRound):
            out.append("start" if action.accepted is None else f"continue {action.accepted[Channel.CONTENT]!r}")
        elif isinstance(action, Check):
            out.append("check " + " | ".join(s.text for s in action.steps))
        elif isinstance(action, EmitText):
            out.append(f"step {action.text.strip()}")
        elif isinstance(action, DropRound):
            out.append("drop")
        elif isinstance(action, EmitEnd):
            out.append("end")
            break
    return out


def test_each_checked_step_stops_the_model_and_continues_in_a_new_request() -> None:
    core = SequentialCore(Rules("correct", "judge", max_batch_steps=16), ChainContext("r", "m", [], "q", []))
    log = actions(core)
    for item in (TextDelta(Channel.CONTENT, "content", " One."), step("One."), step("Two.")):
        core.receive(item)
    log += actions(core)
    core.receive(faithful())
    log += actions(core)
    for item in (step("Two."), RoundEnd("stop", {"completion_tokens": 2})):
        core.receive(item)
    log += actions(core)
    core.receive(faithful())
    log += actions(core)
    assert log == [
        "start",
        "check One.",  # one step per check, whatever was read ahead
        "step One.",
        "drop",
        "continue ' One.'",
        "check Two.",
        "step Two.",  # the model had finished: nothing to stop
        "end",
    ]
    assert core.stats.rounds == 2
    assert core.ctx.usage.completion_tokens == 1 + 2  # the stopped round's one delta, then vLLM's count
