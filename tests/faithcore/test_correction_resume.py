"""The machine's resume rule: a round whose upstream stream broke after its first token is continued by a
new round from what the client already has, at most `resume_attempts` times per request.

Scripts and lines as in test_correction.py (same helpers); `resumed #n outcome` is the ResumeNote action
the driver counts.
"""

from __future__ import annotations

from typing import Any

import pytest

from faithproxy.faithcore.correction import RoundFailed
from faithproxy.faithcore.errors import UpstreamError, UpstreamStatusError
from faithproxy.faithcore.reasoning_formats import FORMATS
from faithproxy.faithcore.types import Channel, StepKind
from tests.faithcore.test_correction import (
    REASONING,
    Case,
    broke,
    delta,
    end,
    outcome,
    p,
    pieces,
    play,
    r,
    rewrite,
    verdicts,
)


def failed(code: str) -> RoundFailed:
    return RoundFailed(UpstreamError(f"upstream: {code}", code=code))


def refused(status: int, body: object = None) -> RoundFailed:
    return RoundFailed(UpstreamStatusError(f"upstream: HTTP {status}", status_code=status, body=body))


VLLM_ERROR = {"error": {"message": "EngineCore encountered an issue", "type": "InternalServerError", "code": 500}}


CORRECT = [
    Case(
        # the round broke inside "It is" after one whole step: the step is checked and delivered, then a
        # new round continues after it; the cut sentence is written again by the new round
        "break-continues-after-the-verified-steps",
        [(p("One circle."), delta(" It is"), broke()), verdicts("F"), (p("It is red."), end())],
        [
            "start",
            "check One circle.",
            "step One circle.",
            "resumed #1 resumed",
            "drop",
            "continue content=' One circle.'",
            "check It is red.",
        ],
        [("One circle.", "faithful/faithful")],
    ),
    Case(
        "a-truncated-stream-and-a-stall-resume-too",
        [
            (p("One circle."), failed("stream_truncated")),
            verdicts("F"),
            (p("Two."), failed("stalled")),
            verdicts("F"),
            (r("So A."), end()),
        ],
        [
            "start",
            "check One circle.",
            "step One circle.",
            "resumed #1 resumed",
            "drop",
            "continue content=' One circle.'",
            "check Two.",
            "step Two.",
            "resumed #2 resumed",
            "drop",
            "continue content=' One circle. Two.'",
            "step So A.",
            "end stop",
        ],
        [("One circle.", "faithful/faithful"), ("Two.", "faithful/faithful"), ("So A.", "none/none")],
    ),
    Case(
        # a flagged step among the steps read before the break: the rewrite drops the broken round and
        # continues as after any rewrite; the break costs no attempt
        "a-rewrite-before-the-break-continues-as-usual",
        [(p("It is blue."), broke()), verdicts("U"), rewrite("It is red."), verdicts("F"), end()],
        [
            "start",
            "check It is blue.",
            "drop",
            "regenerate It is blue. #1",
            "recheck It is red.",
            "tried #1 fixed",
            "step It is red.",
            "continue content=' It is red.'",
            "end stop",
        ],
        [("It is red.", "unfaithful/faithful fixed@1")],
    ),
    Case(
        "attempts-run-out",
        [(p("Box A."), broke()), verdicts("F"), (p("Box B."), broke()), verdicts("F")],
        [
            "start",
            "check Box A.",
            "step Box A.",
            "resumed #1 resumed",
            "drop",
            "continue content=' Box A.'",
            "check Box B.",
            "step Box B.",
            "resumed #2 exhausted",
            "fail UpstreamError",
        ],
        [("Box A.", "faithful/faithful"), ("Box B.", "faithful/faithful")],
        {"resume_attempts": 1},
    ),
    Case(
        # the stream broke after its headers, before any text (killed in its prefill): nothing was
        # accepted, so the first round goes out again as the client sent it
        "a-break-before-any-token-starts-over",
        [broke(), (p("Box A."), end()), verdicts("F")],
        ["start", "resumed #1 resumed", "drop", "start", "check Box A.", "step Box A.", "end stop"],
        [("Box A.", "faithful/faithful")],
    ),
    Case(
        "a-malformed-chunk-is-no-break",
        [(p("Box A."), failed("malformed")), verdicts("F")],
        ["start", "check Box A.", "step Box A.", "fail UpstreamError"],
        [("Box A.", "faithful/faithful")],
    ),
    *(
        Case(
            # the router has not yet noticed the dead replica: the resume round is refused before its
            # first byte (502, or vllm-router's plain-text 500); that costs an attempt and the next one
            # goes through
            f"a-refused-resume-round-is-tried-again-{status}",
            [(p("Box A."), broke()), verdicts("F"), refused(status), failed("connect"), (r("So A."), end())],
            [
                "start",
                "check Box A.",
                "step Box A.",
                "resumed #1 resumed",
                "drop",
                "continue content=' Box A.'",
                "resumed #2 resumed",
                "drop",
                "continue content=' Box A.'",
                "resumed #3 resumed",
                "drop",
                "continue content=' Box A.'",
                "step So A.",
                "end stop",
            ],
            [("Box A.", "faithful/faithful"), ("So A.", "none/none")],
            {"resume_attempts": 3},
        )
        for status in (502, 500)
    ),
    Case(
        "a-4xx-of-a-resume-round-fails",
        [(p("Box A."), broke()), verdicts("F"), refused(400)],
        [
            "start",
            "check Box A.",
            "step Box A.",
            "resumed #1 resumed",
            "drop",
            "continue content=' Box A.'",
            "fail UpstreamStatusError",
        ],
        [("Box A.", "faithful/faithful")],
    ),
]


CORRECT += [
    *(
        Case(
            # a router whose replica just died refuses the first round before any byte: it goes out again,
            # as the client sent it (nothing was accepted yet). 500 without vLLM's JSON error body is
            # vllm-router's plain-text answer for a replica it cannot reach, before its health check notices
            f"a-first-round-refused-by-a-gateway-goes-out-again-{status}",
            [refused(status), (p("Box A."), end()), verdicts("F")],
            ["start", "resumed #1 resumed", "drop", "start", "check Box A.", "step Box A.", "end stop"],
            [("Box A.", "faithful/faithful")],
        )
        for status in (502, 503, 504, 500)
    ),
    Case(
        "an-unreachable-upstream-is-tried-until-the-attempts-run-out",
        [failed("connect"), failed("connect"), failed("connect")],
        [
            "start",
            "resumed #1 resumed",
            "drop",
            "start",
            "resumed #2 resumed",
            "drop",
            "start",
            "resumed #3 exhausted",
            "fail UpstreamError",
        ],  # fmt: skip
    ),
    Case(
        # vLLM's own 500 (its JSON error object) is no gateway refusing: it would fail the same way again
        "a-500-of-the-first-round-fails",
        [refused(500, VLLM_ERROR)],
        ["start", "fail UpstreamStatusError"],
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in CORRECT])
def test_correct_mode_resumes(case: Case) -> None:
    played = play(case.script, **{"resume_attempts": 2, **case.rules})
    assert played.lines[: len(case.lines)] == case.lines
    assert [(s.text, outcome(s)) for s in played.core.steps[: len(case.steps)]] == case.steps


def test_without_attempts_a_break_fails_as_before() -> None:
    played = play([(p("Box A."), broke()), verdicts("F")])
    assert played.lines == ["start", "check Box A.", "step Box A.", "fail UpstreamError"]


def test_a_resumed_chain_counts_its_resumes_rounds_and_estimated_tokens() -> None:
    # the broken round sent no usage: its tokens are estimated at one per text delta (3 here), the
    # resumed round's are vLLM's count
    played = play(
        [
            (*pieces(" It", " is", " red.", kind=StepKind.PERCEPTION), broke()),
            verdicts("F"),
            (r("So A."), end(completion_tokens=4)),
        ],
        resume_attempts=2,
        completion_budget=50,
    )
    result = played.core.result()
    assert played.lines[-1] == "end stop"
    assert "continue content=' It is red.' max=47" in played.lines
    assert (result.resumes, result.rounds) == (1, 2)
    assert result.usage["completion_tokens"] == 3 + 4


DETECT = [
    Case(
        # the text went out as it came, the cut sentence included: the new round continues from exactly
        # that text, and the sentence it completes is checked as one step
        "detect-continues-from-the-sent-text",
        [(p("One circle."), delta(" It is"), broke()), verdicts("F"), (delta(" red."), end()), verdicts("U")],
        [
            "start",
            "text ' One circle.'",
            "text ' It is'",
            "resumed #1 resumed",
            "drop",
            "continue content=' One circle. It is'",
            "check One circle.",
            "verdicts One circle.",
            "text ' red.'",
            "check It is red.",
            "verdicts It is red.",
            "end stop",
        ],
        [("One circle.", "faithful/faithful"), ("It is red.", "unfaithful/unfaithful residual:not_corrected")],
    ),
    Case(
        "detect-attempts-run-out",
        [(p("Box A."), broke()), verdicts("F"), (p("Box B."), broke())],
        [
            "start",
            "text ' Box A.'",
            "resumed #1 resumed",
            "drop",
            "continue content=' Box A.'",
            "check Box A.",
            "verdicts Box A.",
            "text ' Box B.'",
            "resumed #2 exhausted",
            "fail UpstreamError",
        ],
        [("Box A.", "faithful/faithful"), ("Box B.", "none/none")],
        {"resume_attempts": 1},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in DETECT])
def test_detect_mode_resumes(case: Case) -> None:
    played = play(case.script, **{"mode": "detect", "resume_attempts": 2, **case.rules})
    assert played.lines == case.lines
    assert [(s.text, outcome(s)) for s in played.core.steps] == case.steps


def test_detect_resume_in_the_thinking_of_a_qwen3_model_closes_it_first() -> None:
    # qwen3's template closes a think block left open in the final assistant message: the new round is
    # answer text, and the bridge that closes the thinking goes to the client as text, as it is sent
    script: list[Any] = [(r("So A.", REASONING), broke())]
    played = play(script, mode="detect", resume_attempts=2, reasoning_format=FORMATS["qwen3"])
    assert played.lines[2:] == [
        "resumed #1 resumed",
        "drop",
        "text[reasoning] '\\n'",
        "text '\\n\\n'",
        "continue reasoning=' So A.\\n' content='\\n\\n'",
        "verdicts So A.",  # the answer began: the thinking's last sentence is whole, and checked
    ]
    parser = played.core._parser
    assert parser is not None and parser.channel_of("reasoning") == ("content", Channel.CONTENT)
