"""The correction machine fed as a driver feeds it: recorded chat-completions chunks, read by the wire
reader, cut by the real segmenter and typed by the real step typer. No server, no network."""

from __future__ import annotations

import pytest

from faithproxy.faithcore.correction import (
    WAIT,
    ChainMachine,
    Check,
    Checked,
    EmitEnd,
    EmitExtra,
    EmitText,
    Rules,
    new_machine,
)
from faithproxy.faithcore.correction.phase import Phase, Trigger, advance
from faithproxy.faithcore.correction.wire import ChatChunkReader
from faithproxy.faithcore.types import Channel, Faithfulness, StepKind, Verdict


def chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> dict[str, object]:
    return {"id": "chatcmpl-7", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


# What vLLM streamed for one chain with a reasoning parser: a token or two per chunk, the answer in
# `content`, a tool call delta, the finish reason, then the usage chunk.
RECORDED = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning": "There is a red"}),
    chunk({"reasoning": " circle in the image."}),
    chunk({"reasoning": " So the answer"}),
    chunk({"reasoning": " is A."}),
    chunk({"content": "\n\nA"}),
    chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}),
    chunk({}, "stop"),
    {"id": "chatcmpl-7", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 9}},
]


def run(mode: str) -> tuple[list[object], ChainMachine]:
    core, wire = new_machine(Rules(mode, "d", max_batch_steps=16)), ChatChunkReader()
    actions: list[object] = []

    def take() -> None:
        while (action := core.next_action()) is not WAIT:
            actions.append(action)
            if isinstance(action, Check):  # nothing flagged: every step faithful
                core.receive(Checked([Verdict(Faithfulness.FAITHFUL, "d") for _ in action.steps]))
            if isinstance(action, EmitEnd):
                return

    take()
    for c in RECORDED:
        for event in wire.events(c):
            core.receive(event)
        take()
    core.receive(wire.end())
    take()
    return actions, core


@pytest.mark.parametrize("mode", ["correct", "detect"])
def test_recorded_chunks_are_cut_typed_and_numbered_by_the_machine(mode: str) -> None:
    actions, core = run(mode)
    result = core.result()
    assert [(s.index, s.text, s.channel, s.kind) for s in result.steps] == [
        (0, "There is a red circle in the image.", Channel.REASONING, StepKind.PERCEPTION),
        (1, "So the answer is A.", Channel.REASONING, StepKind.REASONING),
        (2, "A", Channel.CONTENT, StepKind.REASONING),
    ]
    assert [a.delta for a in actions if isinstance(a, EmitExtra)] == [
        {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}
    ]
    assert isinstance(actions[-1], EmitEnd) and actions[-1].finish_reason == "stop"
    # the client gets back every character vLLM sent, in the field it came in
    text = {(a.channel, a.field): "" for a in actions if isinstance(a, EmitText)}
    for a in actions:
        if isinstance(a, EmitText):
            text[a.channel, a.field] += a.text
    assert text == {
        (Channel.REASONING, "reasoning"): "There is a red circle in the image. So the answer is A.",
        (Channel.CONTENT, "content"): "\n\nA",
    }
    assert (result.upstream_id, dict(result.usage)) == (
        "chatcmpl-7",
        {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
    )


def test_a_perception_step_is_checked_as_soon_as_it_is_whole_and_reasoning_never() -> None:
    actions, _ = run("correct")
    assert [[s.text for s in a.steps] for a in actions if isinstance(a, Check)] == [
        ["There is a red circle in the image."]
    ]


def test_the_phase_table_refuses_what_nobody_asked_for() -> None:
    assert advance(Phase.READING, Trigger.CHECK) is Phase.CHECKING
    with pytest.raises(RuntimeError, match="checked is not possible while reading"):
        advance(Phase.READING, Trigger.CHECKED)
    with pytest.raises(RuntimeError):
        advance(Phase.OVER, Trigger.CHECK)
