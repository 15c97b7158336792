"""The shadow replay (server/shadow/checker.py `replay`) drives detect mode's own machine, without asyncio's timing.

A judge names only the first unfaithful step of the steps it is asked about and leaves the ones after it
unknown (detectors/judge.py). The chain below has two unfaithful perception steps, the second after the
first flag. Detect mode with a judge that keeps up with decoding checks each step as it ends, so it catches
both; that is the reference (`live`: one delta per sentence, each check answered before the next delta).
The replay gets the whole round as one delta, as a non-streamed capture holds it, and must count the same,
step by step. A driver that hands the machine the whole round before answering its checks (what the first
shadow replay did) leaves the second flag unknown: the contrast shows what the test would catch.
"""

from __future__ import annotations

from collections.abc import Iterable

from faithproxy.faithcore.correction import (
    WAIT,
    Check,
    Checked,
    Delta,
    DetectMachine,
    EmitEnd,
    Event,
    RoundEnd,
    Rules,
    new_machine,
)
from faithproxy.faithcore.types import Faithfulness, Verdict
from faithproxy.server.doors.messages import messages_events
from faithproxy.server.doors.responses import responses_events
from faithproxy.server.shadow.checker import pieces, replay

CHAIN = [
    "The image shows a red circle. ",
    "It is on a white background. ",
    "A blue square sits above the circle. ",
    "The circle has a thin black outline. ",
    "So the answer is red.",
]
UNFAITHFUL = {CHAIN[0].strip(), CHAIN[2].strip()}


async def first_flag_judge(check: Check) -> Checked:
    """Like the judge: faithful up to the first unfaithful step, that one flagged, the rest not reached."""
    verdicts, flagged = [], False
    for step in check.steps:
        if flagged:
            verdicts.append(Verdict(Faithfulness.UNKNOWN, "judge", reason="judge:x:not_reached"))
        elif step.text in UNFAITHFUL:
            verdicts.append(Verdict(Faithfulness.UNFAITHFUL, "judge"))
            flagged = True
        else:
            verdicts.append(Verdict(Faithfulness.FAITHFUL, "judge"))
    return Checked(verdicts)


def machine() -> DetectMachine:
    core = new_machine(Rules("detect", "judge"))  # detect mode's rules: batches of up to 16 steps
    assert isinstance(core, DetectMachine)
    return core


def outcomes(core: DetectMachine) -> list[tuple[str, str, str | None]]:
    """(text, kind, detected verdict) of every step, as the trace and the counters see them."""
    return [
        (s.text, s.kind.value, s.first_verdict.faithfulness.value if s.first_verdict else None)
        for s in core.result().steps
    ]


async def live(events: Iterable[Event]) -> DetectMachine:
    """detect mode when the judge keeps up: each event read, then every check answered, then the next."""
    core, pending = machine(), iter(events)
    while not isinstance(action := core.next_action(), EmitEnd):
        if action is WAIT:
            core.receive(next(pending))
        elif isinstance(action, Check):
            core.receive(await first_flag_judge(action))
    return core


async def read_first(events: Iterable[Event]) -> DetectMachine:
    """A driver that reads the whole round before the machine's first check is answered."""
    core = machine()
    for event in events:
        core.receive(event)
    while not isinstance(action := core.next_action(), EmitEnd):
        if isinstance(action, Check):
            core.receive(await first_flag_judge(action))
    return core


async def test_the_replay_counts_each_step_as_detect_mode_does_a_second_flag_included() -> None:
    reference = outcomes(await live([*(Delta("reasoning", s) for s in CHAIN), RoundEnd("stop")]))
    assert [text for text, _, verdict in reference if verdict == "unfaithful"] == [CHAIN[0].strip(), CHAIN[2].strip()]

    whole = [Delta("reasoning", "".join(CHAIN)), RoundEnd("stop")]  # a non-streamed capture: one delta
    shadow = machine()
    await replay(shadow, pieces(whole), first_flag_judge)
    assert outcomes(shadow) == reference  # step by step: text, kind, verdict

    # A judge that falls behind gets the whole chain in one batch and stops at its first flag: the steps
    # it did not reach are asked about again, so the second flag is caught there too. (A reasoning step
    # batched with perception steps gets a verdict as well; alone, it goes unasked: compare perception.)
    def perception(steps: list[tuple[str, str, str | None]]) -> list[tuple[str, str, str | None]]:
        return [s for s in steps if s[1] == "perception"]

    assert perception(outcomes(await read_first(whole))) == perception(reference)


def test_pieces_cut_text_into_words_and_keep_every_character() -> None:
    events = [Delta("content", "  A red circle.\n\nIt is  big. "), RoundEnd("stop")]
    cut = list(pieces(events))
    assert [e.text for e in cut if isinstance(e, Delta)] == ["  A", " red", " circle.", "\n\nIt", " is", "  big.", " "]
    assert cut[-1] == RoundEnd("stop")


def test_a_responses_or_messages_stream_that_failed_holds_no_chain() -> None:
    delta = b'event: response.reasoning_text.delta\ndata: {"type": "response.reasoning_text.delta", "delta": "A."}\n\n'
    failed = b'event: response.failed\ndata: {"type": "response.failed", "response": {"status": "failed"}}\n\n'
    done = b'event: response.completed\ndata: {"type": "response.completed", "response": {"id": "r"}}\n\n'
    assert responses_events(delta + failed, True) is None
    assert responses_events(delta + done, True) == [Delta("reasoning", "A."), RoundEnd("stop", None, "r")]
    text = b'data: {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "A."}}\n\n'
    error = b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error"}}\n\n'
    assert messages_events(text + error, True) is None
    assert messages_events(text, True) == [Delta("content", "A."), RoundEnd(None, None, None)]
