"""The correction machine (faithcore/correction/), transition by transition, without asyncio.

Each case is a script: groups of events fed to the machine (upstream deltas, check and regeneration
results); before each group and at the end, every action the machine has for us is taken and written down
as a short line. A case states the lines it expects and the outcome of every step the client received.

The scripts state where steps end and what kind they are: the machine's rules take a segmenter that cuts
after every fed piece ending a sentence and a typer that reads the kind each script gave its step (the
real segmenter and typer are tested in test_segmenter.py and test_kinds.py, and with the machine in
test_correction_wire.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from faithproxy.faithcore.context import Usage
from faithproxy.faithcore.correction import (
    WAIT,
    ChainMachine,
    Check,
    Checked,
    Delta,
    DropRound,
    EmitEnd,
    EmitExtra,
    EmitText,
    EmitVerdicts,
    Event,
    Extras,
    Fail,
    Regenerate,
    Regenerated,
    RegenerationNote,
    ResumeNote,
    RoundEnd,
    RoundFailed,
    Rules,
    StartRound,
    new_machine,
)
from faithproxy.faithcore.errors import DetectorError, RegenerationError, UpstreamError
from faithproxy.faithcore.segmenter import StepSegmenter
from faithproxy.faithcore.types import Channel, Faithfulness, Segment, Step, StepKind, Verdict

P, R = StepKind.PERCEPTION, StepKind.REASONING
CONTENT, REASONING = Channel.CONTENT, Channel.REASONING

# ---- how the scripts cut and type steps --------------------------------------------------------

KINDS: dict[str, StepKind] = {}  # each step text of the scripts, with the kind its script gave it


class ScriptedSegmenter:
    """Cuts after every fed piece whose text ends a sentence (whitespace after the end stays for the next
    step, or trails): the script says where each step ends."""

    def __init__(self, tags: tuple[str, ...] = ()) -> None:
        self._buffer = ""

    def feed(self, text: str) -> list[Segment]:
        self._buffer += text
        cut = len(self._buffer.rstrip())
        if not self._buffer[:cut].endswith((".", "?", "!")):
            return []
        raw, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return [Segment(0, raw.strip(), raw)]

    def flush(self) -> list[Segment]:
        raw, self._buffer = self._buffer, ""
        return [Segment(0, raw.strip(), raw)] if raw else []

    def settled_lead(self) -> str:
        return self._buffer[: len(self._buffer) - len(self._buffer.lstrip())]


def scripted_kind(text: str) -> StepKind:
    return KINDS[text]


def rules(**overrides: Any) -> Rules:
    return Rules(**{"mode": "correct", "detector": "d", "segmenter": ScriptedSegmenter, "typer": scripted_kind,
                    **overrides})  # fmt: skip


# ---- events ------------------------------------------------------------------------------------

_FIELD = {CONTENT: "content", REASONING: "reasoning"}


def said(text: str, kind: StepKind, channel: Channel, name: str | None) -> Delta:
    assert KINDS.setdefault(text, kind) is kind, f"{text!r} is given two kinds"
    return Delta(name or _FIELD[channel], " " + text)


def p(text: str, channel: Channel = CONTENT, name: str | None = None) -> Delta:
    """A perception step as one delta (the space before it included)."""
    return said(text, P, channel, name)


def r(text: str, channel: Channel = CONTENT, name: str | None = None) -> Delta:
    return said(text, R, channel, name)


def pieces(*texts: str, kind: StepKind) -> tuple[Delta, ...]:
    """One step said in several deltas (one per token, as vLLM streams)."""
    KINDS["".join(texts).strip()] = kind
    return tuple(Delta("content", text) for text in texts)


def delta(text: str, channel: Channel = CONTENT, name: str | None = None) -> Delta:
    """Text that ends no step by itself."""
    return Delta(name or _FIELD[channel], text)


def end(reason: str = "stop", completion_tokens: int = 10) -> RoundEnd:
    return RoundEnd(reason, {"prompt_tokens": 5, "completion_tokens": completion_tokens}, "upstream-1")


def broke() -> RoundFailed:
    return RoundFailed(UpstreamError("upstream stream broke", code="stream_broken"))


_FAITHFULNESS = {
    "F": Faithfulness.FAITHFUL,
    "U": Faithfulness.UNFAITHFUL,
    "N": Faithfulness.UNKNOWN,
    "S": Faithfulness.UNSURE,
}


def verdicts(letters: str) -> Checked:
    """One verdict per letter: F faithful, U unfaithful, N unknown, S unsure (a flag under the threshold)."""
    return Checked([Verdict(_FAITHFULNESS[c], "d") for c in letters])


def detector_down() -> Checked:
    return Checked(error=DetectorError("judge timed out", code="timeout"))


def rewrite(text: str) -> Regenerated:
    return Regenerated(text)


UNPARSEABLE = Regenerated(None)


def regeneration_down() -> Regenerated:
    return Regenerated(error=RegenerationError("regenerator down"))


# ---- playing a script --------------------------------------------------------------------------


def line(action: Any) -> str:
    """An action as one short line."""
    if isinstance(action, StartRound):
        if action.prefix is None:
            return "start"
        parts = [f"{c.value}={t!r}" for c, t in action.prefix.items() if t]
        if action.max_tokens is not None:
            parts.append(f"max={action.max_tokens}")
        return " ".join(["continue", *parts])
    if isinstance(action, DropRound):
        return "drop"
    if isinstance(action, Check):
        return ("recheck " if action.candidate else "check ") + " | ".join(s.text for s in action.steps)
    if isinstance(action, Regenerate):
        return f"regenerate {action.step.text} #{action.attempt}"
    if isinstance(action, RegenerationNote):
        return f"tried #{action.attempt} {action.outcome}"
    if isinstance(action, EmitText):
        where = "" if action.field == "content" else f"[{action.field}]"
        return f"step{where} {action.step.text}" if action.step else f"text{where} {action.text!r}"
    if isinstance(action, EmitExtra):
        return f"extra {action.delta}"
    if isinstance(action, EmitVerdicts):
        return "verdicts " + " | ".join(s.text for s in action.steps)
    if isinstance(action, EmitEnd):
        return f"end {action.finish_reason}"
    if isinstance(action, ResumeNote):
        return f"resumed #{action.attempt} {action.outcome}"
    assert isinstance(action, Fail)
    return f"fail {type(action.error).__name__}"


def outcome(step: Step) -> str:
    """A step's outcome: verdict of its original text / final verdict, then what happened to it."""
    detected = step.first_verdict.faithfulness.value if step.first_verdict else "none"
    final = step.verdict.faithfulness.value if step.verdict else "none"
    parts = [f"{detected}/{final}"]
    if step.original_text is not None:
        parts.append(f"fixed@{step.attempts}")
    elif step.attempts:
        parts.append(f"tries={step.attempts}")
    if step.residual:
        parts.append(f"residual:{step.residual_reason}")
    if step.unchecked_reason:
        parts.append(f"unchecked:{step.unchecked_reason}")
    return " ".join(parts)


@dataclass
class Played:
    lines: list[str]
    core: ChainMachine
    over: bool
    checks: list[Check] = field(default_factory=list)


def play(script: list[Event | tuple[Event, ...]], **overrides: Any) -> Played:
    core = new_machine(rules(**overrides))
    lines: list[str] = []
    checks: list[Check] = []
    over = False

    streaming = False  # what the driver holds: an upstream stream, opened by StartRound

    def take() -> None:
        nonlocal over, streaming
        while not over and (action := core.next_action()) is not WAIT:
            lines.append(line(action))
            if isinstance(action, Check):
                checks.append(action)
            over = isinstance(action, EmitEnd | Fail)
            if isinstance(action, DropRound):  # the driver has no stream to close otherwise
                assert streaming, f"DropRound with no stream open, after {lines}"
            streaming = isinstance(action, StartRound) or (streaming and not isinstance(action, DropRound))

    for group in script:
        take()
        for event in group if isinstance(group, tuple) else (group,):
            core.receive(event)
    take()
    return Played(lines, core, over, checks)


@dataclass
class Case:
    id: str
    script: list[Event | tuple[Event, ...]]
    lines: list[str]
    steps: list[tuple[str, str]] = field(default_factory=list)  # (text, outcome) of each emitted step
    rules: dict[str, Any] = field(default_factory=dict)

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


# ---- correct mode ------------------------------------------------------------------------------

_FAILED_TRY = {
    "still_unfaithful": lambda i: [rewrite(f"Try {i}."), verdicts("U")],
    "unparseable": lambda i: [UNPARSEABLE],
    "error": lambda i: [regeneration_down()],
}


def _try_lines(i: int, how: str) -> list[str]:
    return ([f"recheck Try {i}."] if how == "still_unfaithful" else []) + [f"tried #{i} {how}"]


def fixed_at(k: int) -> Case:
    """The flagged step is fixed at try k; tries before fail each its own way."""
    failures = [list(_FAILED_TRY)[i % 3] for i in range(k - 1)]
    script: list[Any] = [(p("One circle."), p("It is blue."), r("So B."))]
    script.append(verdicts("FUN"))
    lines = ["start", "check One circle. | It is blue. | So B.", "step One circle.", "drop"]
    for i, how in enumerate(failures, start=1):
        lines.append(f"regenerate It is blue. #{i}")
        script += _FAILED_TRY[how](i)
        lines += _try_lines(i, how)
    script += [rewrite("It is red."), verdicts("F"), (r("So A."), end())]
    lines += [
        f"regenerate It is blue. #{k}",
        "recheck It is red.",
        f"tried #{k} fixed",
        "step It is red.",
        "continue content=' One circle. It is red.'",
        "step So A.",  # reasoning, and this detector only looks at perception: no call
        "end stop",
    ]
    steps = [("One circle.", "faithful/faithful"), ("It is red.", f"unfaithful/faithful fixed@{k}")]
    return Case(f"fixed-at-try-{k}", script, lines, steps + [("So A.", "none/none")])


# "It is blue." flagged at once, its one try rejected: kept, and decoding continues after it.
_KEPT_AFTER_ONE_TRY = [
    "start",
    "check It is blue.",
    "drop",
    "regenerate It is blue. #1",
    "recheck Try 1.",
    "tried #1 still_unfaithful",
    "step It is blue.",
    "continue content=' It is blue.'",
]


def residual_after(k: int) -> Case:
    """K tries fail: the ORIGINAL step is kept, residual, and decoding continues after it."""
    script: list[Any] = [(p("It is blue."),), verdicts("U")]
    lines = ["start", "check It is blue.", "drop"]
    for i in range(1, k + 1):
        how = "still_unfaithful" if i == 1 else "unparseable"
        lines.append(f"regenerate It is blue. #{i}")
        script += _FAILED_TRY[how](i)
        lines += _try_lines(i, how)
    script += [end()]
    lines += ["step It is blue.", "continue content=' It is blue.'", "end stop"]
    steps = [("It is blue.", f"unfaithful/unfaithful tries={k} residual:regeneration_failed")]
    return Case(f"residual-after-{k}-tries", script, lines, steps, {"max_retries": k})


CORRECT = [
    Case(
        # the dropped round read two steps past the flagged one: after K failed tries the step is kept,
        # and those two are checked again and delivered; the new round starts after them
        "kept-step-resumes-after-the-read-ahead",
        [
            (p("One circle."), p("It is blue.")),
            (p("It is big."), r("So B."), verdicts("FU")),
            rewrite("Try 1."),
            verdicts("U"),
            verdicts("FF"),
            (r("So A."), end()),
        ],
        [
            "start",
            "check One circle. | It is blue.",
            "step One circle.",
            "drop",
            "regenerate It is blue. #1",
            "recheck Try 1.",
            "tried #1 still_unfaithful",
            "step It is blue.",
            "continue content=' One circle. It is blue. It is big. So B.'",
            "check It is big. | So B.",
            "step It is big.",
            "step So B.",
            "step So A.",
            "end stop",
        ],
        [
            ("One circle.", "faithful/faithful"),
            ("It is blue.", "unfaithful/unfaithful tries=1 residual:regeneration_failed"),
            ("It is big.", "faithful/faithful"),
            ("So B.", "faithful/faithful"),
            ("So A.", "none/none"),
        ],
        {"max_retries": 1},
    ),
    Case(
        # the round had ended: its read-ahead is the rest of the chain, and no round follows the kept step
        "kept-step-of-an-ended-round-finishes-with-its-read-ahead",
        [(p("It is blue."), r("So B."), end("length")), verdicts("UN"), rewrite("Try 1."), verdicts("U")],
        [
            "start",
            "check It is blue. | So B.",
            "drop",
            "regenerate It is blue. #1",
            "recheck Try 1.",
            "tried #1 still_unfaithful",
            "step It is blue.",
            "step So B.",  # reasoning, unknown before: this detector only looks at perception, no call
            "end length",
        ],
        [
            ("It is blue.", "unfaithful/unfaithful tries=1 residual:regeneration_failed"),
            ("So B.", "none/none"),
        ],
        {"max_retries": 1},
    ),
    Case(
        # a step of the resumed read-ahead of an ended round is flagged in turn: no stream is open to
        # drop, and once it is rewritten a new round continues after the rewrite
        "a-flag-in-the-resumed-read-ahead-of-an-ended-round",
        [
            (p("It is blue."), p("It is big."), end()),
            verdicts("UN"),
            rewrite("Try 1."),
            verdicts("U"),
            verdicts("U"),
            rewrite("It is small."),
            verdicts("F"),
            (r("So A."), end()),
        ],
        [
            "start",
            "check It is blue. | It is big.",
            "drop",
            "regenerate It is blue. #1",
            "recheck Try 1.",
            "tried #1 still_unfaithful",
            "step It is blue.",
            "check It is big.",
            "regenerate It is big. #1",
            "recheck It is small.",
            "tried #1 fixed",
            "step It is small.",
            "continue content=' It is blue. It is small.'",
            "step So A.",
            "end stop",
        ],
        [
            ("It is blue.", "unfaithful/unfaithful tries=1 residual:regeneration_failed"),
            ("It is small.", "unfaithful/faithful fixed@1"),
            ("So A.", "none/none"),
        ],
        {"max_retries": 1},
    ),
    Case(
        # a non-text delta cannot be part of a continuation: the read-ahead goes, as after a rewrite
        "kept-step-with-a-tool-delta-in-its-read-ahead-decodes-it-again",
        [(p("It is blue."), Extras({"tool_calls": []})), verdicts("U"), rewrite("Try 1."), verdicts("U"), end()],
        [
            *_KEPT_AFTER_ONE_TRY,
            "end stop",
        ],
        [("It is blue.", "unfaithful/unfaithful tries=1 residual:regeneration_failed")],
        {"max_retries": 1},
    ),
    Case(
        "faithful",
        [(p("One circle."), r("So A."), end()), verdicts("FF")],
        ["start", "check One circle. | So A.", "step One circle.", "step So A.", "end stop"],
        [("One circle.", "faithful/faithful"), ("So A.", "faithful/faithful")],
    ),
    *(fixed_at(k) for k in (1, 2, 3)),
    residual_after(1),
    residual_after(3),
    Case(
        "regeneration-budget-spent-mid-correction-then-before-any-try",
        [
            (p("It is blue."),),
            verdicts("U"),
            rewrite("Try 1."),
            verdicts("U"),
            (p("It is big."), end()),
            verdicts("U"),
        ],
        [
            *_KEPT_AFTER_ONE_TRY,
            "check It is big.",
            "step It is big.",
            "end stop",
        ],
        [
            ("It is blue.", "unfaithful/unfaithful tries=1 residual:regeneration_failed"),
            ("It is big.", "unfaithful/unfaithful residual:not_corrected"),
        ],
        {"max_regenerations": 1},
    ),
    Case(
        "no-retries-not-corrected",
        [(p("It is blue."), p("It is big."), end()), verdicts("UU")],
        ["start", "check It is blue. | It is big.", "step It is blue.", "step It is big.", "end stop"],
        [
            ("It is blue.", "unfaithful/unfaithful residual:not_corrected"),
            ("It is big.", "unfaithful/unfaithful residual:not_corrected"),
        ],
        {"max_retries": 0},
    ),
    Case(
        "detector-error-pass-first-check",
        [(p("One circle."), r("So A."), end()), detector_down()],
        ["start", "check One circle. | So A.", "step One circle.", "step So A.", "end stop"],
        [
            ("One circle.", "unknown/unknown residual:unchecked unchecked:detector_error"),
            ("So A.", "unknown/unknown unchecked:detector_error"),
        ],
    ),
    Case(
        "detector-error-fail-first-check",
        [(p("One circle."), end()), detector_down()],
        ["start", "check One circle.", "fail DetectorError"],
        [],
        {"on_detector_error": "fail"},
    ),
    Case(
        "detector-error-pass-recheck",
        [(p("It is blue."),), verdicts("U"), rewrite("It is red."), detector_down(), end()],
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
        [("It is red.", "unfaithful/unknown fixed@1 residual:unchecked unchecked:detector_error")],
    ),
    Case(
        "detector-error-fail-recheck",
        [(p("One circle."), p("It is blue.")), verdicts("FU"), rewrite("It is red."), detector_down()],
        [
            "start",
            "check One circle. | It is blue.",
            "step One circle.",
            "drop",
            "regenerate It is blue. #1",
            "recheck It is red.",
            "fail DetectorError",
        ],
        [("One circle.", "faithful/faithful")],
        {"on_detector_error": "fail"},
    ),
    Case(
        "detector-bug-fails-even-under-pass",
        [(p("One circle."), end()), Checked(error=ValueError("bug"))],
        ["start", "check One circle.", "fail ValueError"],
    ),
    Case(
        "unknown-recheck-is-unchecked",
        [(p("It is blue."),), verdicts("U"), rewrite("It is red."), verdicts("N"), end()],
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
        [("It is red.", "unfaithful/unknown fixed@1 residual:unchecked unchecked:detector_error")],
    ),
    Case(
        "detector-none-passes-unchecked",
        [(p("One circle."), r("So A."), end()), verdicts("NN")],
        ["start", "check One circle. | So A.", "step One circle.", "step So A.", "end stop"],
        [
            ("One circle.", "unknown/unknown residual:unchecked unchecked:detector_none"),
            ("So A.", "unknown/unknown"),
        ],
        {"detector_gives_verdicts": False},
    ),
    Case(
        "detector-types-a-reasoning-step-as-perception",
        [(r("The car is blue."), end()), Checked([Verdict(Faithfulness.UNFAITHFUL, "d", kind=P)])],
        ["start", "check The car is blue.", "step The car is blue.", "end stop"],
        [("The car is blue.", "unfaithful/unfaithful residual:not_corrected")],
        {"detector_types_steps": True, "max_retries": 0},
    ),
    Case(
        "upstream-failure-before-first-emit",
        [broke()],
        ["start", "fail UpstreamError"],
    ),
    Case(
        "upstream-failure-after-whole-steps-delivers-them-first",
        [(p("One circle."), broke()), verdicts("F")],
        ["start", "check One circle.", "step One circle.", "fail UpstreamError"],
        [("One circle.", "faithful/faithful")],
    ),
    Case(
        "upstream-failure-after-first-emit",
        [(p("One circle."),), verdicts("F"), broke()],
        ["start", "check One circle.", "step One circle.", "fail UpstreamError"],
        [("One circle.", "faithful/faithful")],
    ),
    Case(
        "upstream-failure-in-a-dropped-round-does-not-matter",
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
        "end-arrives-while-a-batch-is-verified",
        [(p("One circle."),), end("length"), verdicts("F")],
        ["start", "check One circle.", "step One circle.", "end length"],
        [("One circle.", "faithful/faithful")],
    ),
    Case(
        "batches-of-at-most-max-batch-steps",
        [(p("A1."), p("A2."), p("A3."), end()), verdicts("FF"), verdicts("F")],
        ["start", "check A1. | A2.", "step A1.", "step A2.", "check A3.", "step A3.", "end stop"],
        [("A1.", "faithful/faithful"), ("A2.", "faithful/faithful"), ("A3.", "faithful/faithful")],
        {"max_batch_steps": 2},
    ),
    Case(
        "a-batch-limit-below-one-still-checks-one-step-at-a-time",
        [(p("A1."), p("A2."), end()), verdicts("F"), verdicts("F")],
        ["start", "check A1.", "step A1.", "check A2.", "step A2.", "end stop"],
        [("A1.", "faithful/faithful"), ("A2.", "faithful/faithful")],
        {"max_batch_steps": 0},
    ),
    Case(
        "no-call-for-reasoning-when-the-detector-does-not-type-steps",
        [(r("So A."), end())],
        ["start", "step So A.", "end stop"],
        [("So A.", "none/none")],
    ),
    Case(
        "a-detector-that-types-steps-sees-reasoning-too",
        [(r("So A."), end()), verdicts("F")],
        ["start", "check So A.", "step So A.", "end stop"],
        [("So A.", "faithful/faithful")],
        {"detector_types_steps": True},
    ),
    Case(
        "the-gate-keeps-a-batch-without-perception-from-a-detector-that-types-steps",
        [(r("Let me look."), r("So A."), end())],
        ["start", "step Let me look.", "step So A.", "end stop"],
        [("Let me look.", "none/none unchecked:gated"), ("So A.", "none/none unchecked:gated")],
        {"detector_types_steps": True, "gate_without_perception": True},
    ),
    Case(
        "the-gate-sends-a-batch-with-one-perception-step-whole-and-the-detector-retypes-it",
        [
            (r("Let me look."), p("The car is red."), end()),
            Checked([Verdict(Faithfulness.FAITHFUL, "d", kind=R), Verdict(Faithfulness.FAITHFUL, "d", kind=P)]),
        ],
        ["start", "check Let me look. | The car is red.", "step Let me look.", "step The car is red.", "end stop"],
        [("Let me look.", "faithful/faithful"), ("The car is red.", "faithful/faithful")],
        {"detector_types_steps": True, "gate_without_perception": True},
    ),
    Case(
        "the-gate-passes-reasoning-batches-and-checks-the-perception-one-after",
        [
            (r("Let me look."),),
            (p("The car is red."), end()),
            verdicts("U"),
            rewrite("The car is blue."),
            verdicts("F"),
        ],
        [
            "start",
            "step Let me look.",
            "check The car is red.",
            "drop",
            "regenerate The car is red. #1",
            "recheck The car is blue.",
            "tried #1 fixed",
            "step The car is blue.",
            "continue content=' Let me look. The car is blue.'",
        ],
        [("Let me look.", "none/none unchecked:gated"), ("The car is blue.", "unfaithful/faithful fixed@1")],
        {"detector_types_steps": True, "gate_without_perception": True},
    ),
    Case(
        # the detector typed "It is big." reasoning with the verdict that is discarded when the step
        # before it is kept: checked again, it is the typer's perception step, not a batch for the gate
        "a-read-ahead-step-the-detector-retyped-goes-back-to-the-typers-kind-and-past-the-gate",
        [
            (p("It is blue."), p("It is big.")),
            Checked([Verdict(Faithfulness.UNFAITHFUL, "d", kind=P), Verdict(Faithfulness.UNKNOWN, "d", kind=R)]),
            rewrite("Try 1."),
            verdicts("U"),
            verdicts("F"),
            (r("So A."), end()),
        ],
        [
            "start",
            "check It is blue. | It is big.",
            "drop",
            "regenerate It is blue. #1",
            "recheck Try 1.",
            "tried #1 still_unfaithful",
            "step It is blue.",
            "continue content=' It is blue. It is big.'",
            "check It is big.",
            "step It is big.",
            "step So A.",
            "end stop",
        ],
        [
            ("It is blue.", "unfaithful/unfaithful tries=1 residual:regeneration_failed"),
            ("It is big.", "faithful/faithful"),
            ("So A.", "none/none unchecked:gated"),
        ],
        {"max_retries": 1, "detector_types_steps": True, "gate_without_perception": True},
    ),
    Case(
        "the-gate-marks-nothing-for-a-detector-that-only-sees-perception-steps",
        [(r("So A."), end())],
        ["start", "step So A.", "end stop"],
        [("So A.", "none/none")],
        {"gate_without_perception": True},
    ),
    Case(
        # the newline after the last step is known to trail only when the round ends: after the extras
        "trailing-raw-and-extras-keep-their-place",
        [
            (
                p("One circle."),
                delta("\n"),
                Extras({"tool_calls": [{"index": 0}]}),
                end(),
            ),
            verdicts("F"),
        ],
        [
            "start",
            "check One circle.",
            "step One circle.",
            "extra {'tool_calls': [{'index': 0}]}",
            "text '\\n'",
            "end stop",
        ],
        [("One circle.", "faithful/faithful")],
    ),
    Case(
        "reasoning-and-content-channels",
        [
            (
                p("One circle.", REASONING, "reasoning_content"),
                p("It is blue.", REASONING, "reasoning_content"),
                delta("\n", REASONING, "reasoning_content"),
                r("A.", CONTENT, "content"),  # the answer starts: the reasoning's trailing newline first
            ),
            verdicts("FUN"),
            rewrite("It is red."),
            verdicts("F"),
            (delta("\n", REASONING, "reasoning_content"), r("So A.", CONTENT), end()),
        ],
        [
            "start",
            "check One circle. | It is blue. | A.",
            "step[reasoning_content] One circle.",
            "drop",
            "regenerate It is blue. #1",
            "recheck It is red.",
            "tried #1 fixed",
            "step[reasoning_content] It is red.",
            "continue reasoning=' One circle. It is red.'",
            "text[reasoning_content] '\\n'",
            "step So A.",
            "end stop",
        ],
        [
            ("One circle.", "faithful/faithful"),
            ("It is red.", "unfaithful/faithful fixed@1"),
            ("So A.", "none/none"),
        ],
    ),
]


# A flag under the judge's threshold (UNSURE): delivered, never rewritten, not residual.
CORRECT_UNSURE = [
    Case(
        "an-unsure-flag-is-delivered-and-never-rewritten",
        [(p("One circle."), p("It is blue."), r("So B.")), verdicts("FSF"), end()],
        [
            "start",
            "check One circle. | It is blue. | So B.",
            "step One circle.",
            "step It is blue.",
            "step So B.",
            "end stop",
        ],  # fmt: skip
        [
            ("One circle.", "faithful/faithful"),
            ("It is blue.", "unsure/unsure"),
            ("So B.", "faithful/faithful"),
        ],
    ),
    Case(
        "an-unsure-flag-before-a-sure-one-leaves-the-sure-one-to-be-rewritten",
        [(p("It is red."), p("It is blue.")), verdicts("SU"), rewrite("It is green."), verdicts("F"), end()],
        [
            "start",
            "check It is red. | It is blue.",
            "step It is red.",
            "drop",
            "regenerate It is blue. #1",
            "recheck It is green.",
            "tried #1 fixed",
            "step It is green.",
            "continue content=' It is red. It is green.'",
            "end stop",
        ],  # fmt: skip
        [("It is red.", "unsure/unsure"), ("It is green.", "unfaithful/faithful fixed@1")],
    ),
    Case(
        "a-rewrite-judged-unsure-is-taken",
        [p("It is blue."), verdicts("U"), rewrite("It is green."), verdicts("S"), end()],
        [
            "start",
            "check It is blue.",
            "drop",
            "regenerate It is blue. #1",
            "recheck It is green.",
            "tried #1 fixed",
            "step It is green.",
            "continue content=' It is green.'",
            "end stop",
        ],  # fmt: skip
        [("It is green.", "unfaithful/unsure fixed@1")],
    ),
]


# The regenerator's samples mostly restate the flagged step (ReflectRegenerator's insist_share): the step
# is kept after the first try, residual with its reason, and no further try is spent.
CORRECT_UNSURE.append(
    Case(
        "the-model-insists-the-step-is-kept-after-one-try",
        [(p("It is blue."), r("So B.")), verdicts("UF"), Regenerated(insisted=True), end()],
        [
            "start",
            "check It is blue. | So B.",
            "drop",
            "regenerate It is blue. #1",
            "tried #1 insisted",
            "step It is blue.",
            "continue content=' It is blue. So B.'",
            "step So B.",
            "end stop",
        ],  # fmt: skip
        [("It is blue.", "unfaithful/unfaithful tries=1 residual:insisted"), ("So B.", "none/none")],
        {"max_retries": 3},
    )
)


@pytest.mark.parametrize("case", [c.param() for c in CORRECT_UNSURE])
def test_correct_mode_with_unsure_flags(case: Case) -> None:
    played = play(case.script, **case.rules)
    assert played.lines == case.lines  # only a sure flag is ever regenerated
    assert [(s.text, outcome(s)) for s in played.core.steps] == case.steps


def test_detect_mode_delivers_an_unsure_flag_as_it_is() -> None:
    played = play([(p("It is blue."), r("So B.")), verdicts("SF"), end()], mode="detect")
    outcomes = [(s.text, outcome(s)) for s in played.core.steps]
    assert outcomes == [("It is blue.", "unsure/unsure"), ("So B.", "faithful/faithful")]


@pytest.mark.parametrize("case", [c.param() for c in CORRECT])
def test_correct_mode(case: Case) -> None:
    played = play(case.script, **case.rules)
    assert played.lines == case.lines
    assert [(s.text, outcome(s)) for s in played.core.steps] == case.steps
    assert [s.index for s in played.core.steps] == list(range(len(case.steps)))


# ---- detect mode -------------------------------------------------------------------------------

DETECT = [
    Case(
        "text-at-once-verdicts-after",
        [
            p("One circle."),
            p("It is blue."),
            verdicts("F"),
            end(),
            verdicts("U"),
        ],
        [
            "start",
            "text ' One circle.'",
            "check One circle.",
            "text ' It is blue.'",
            "verdicts One circle.",
            "check It is blue.",
            "verdicts It is blue.",
            "end stop",
        ],
        [("One circle.", "faithful/faithful"), ("It is blue.", "unfaithful/unfaithful residual:not_corrected")],
    ),
    Case(
        "one-call-at-a-time-in-batches-of-at-most-max-batch-steps",
        [p("A1."), p("A2."), p("A3."), p("A4."), verdicts("F"), verdicts("FF"), end(), verdicts("F")],
        [
            "start",
            "text ' A1.'",
            "check A1.",
            "text ' A2.'",
            "text ' A3.'",
            "text ' A4.'",
            "verdicts A1.",
            "check A2. | A3.",
            "verdicts A2. | A3.",
            "check A4.",
            "verdicts A4.",
            "end stop",
        ],
        [(f"A{i}.", "faithful/faithful") for i in range(1, 5)],
        {"max_batch_steps": 2},
    ),
    Case(
        "end-waits-for-the-check-in-flight",
        [p("One circle."), end(), verdicts("F")],
        ["start", "text ' One circle.'", "check One circle.", "verdicts One circle.", "end stop"],
        [("One circle.", "faithful/faithful")],
    ),
    Case(
        "upstream-failure-fails-at-once",
        [p("One circle."), broke()],
        ["start", "text ' One circle.'", "check One circle.", "fail UpstreamError"],
        [("One circle.", "none/none")],
    ),
    Case(
        "detector-error-pass",
        [p("One circle."), end(), detector_down()],
        ["start", "text ' One circle.'", "check One circle.", "verdicts One circle.", "end stop"],
        [("One circle.", "unknown/unknown residual:unchecked unchecked:detector_error")],
    ),
    Case(
        "detector-error-fail",
        [p("One circle."), detector_down()],
        ["start", "text ' One circle.'", "check One circle.", "fail DetectorError"],
        [("One circle.", "none/none")],
        {"on_detector_error": "fail"},
    ),
    Case(
        "never-regenerates",
        [p("It is blue."), end(), verdicts("U")],
        ["start", "text ' It is blue.'", "check It is blue.", "verdicts It is blue.", "end stop"],
        [("It is blue.", "unfaithful/unfaithful residual:not_corrected")],
        {"max_retries": 3},
    ),
    Case(
        "reasoning-without-a-call-trailing-raw-dropped-extras-passed",
        [
            r("So A.", REASONING),
            delta("\n", REASONING),
            Extras({"tool_calls": []}),
            end(),
        ],
        [
            "start",
            "text[reasoning] ' So A.'",
            "verdicts So A.",
            "text[reasoning] '\\n'",
            "extra {'tool_calls': []}",
            "end stop",
        ],
        [("So A.", "none/none")],
    ),
    Case(
        "the-gate-settles-a-reasoning-batch-without-a-call-even-for-a-detector-that-types-steps",
        [r("So A."), p("It is red."), end(), verdicts("F")],
        [
            "start",
            "text ' So A.'",
            "verdicts So A.",
            "text ' It is red.'",
            "check It is red.",
            "verdicts It is red.",
            "end stop",
        ],
        [("So A.", "none/none unchecked:gated"), ("It is red.", "faithful/faithful")],
        {"detector_types_steps": True, "gate_without_perception": True},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in DETECT])
def test_detect_mode(case: Case) -> None:
    played = play(case.script, **{"mode": "detect", **case.rules})
    assert played.lines == case.lines
    assert [(s.text, outcome(s)) for s in played.core.steps] == case.steps


# ---- accounting --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "completion_tokens", "continuation"),
    [
        # the round ended before its flagged step was judged: vLLM's own count
        pytest.param([(p("It is blue."), end(completion_tokens=30)), verdicts("U")], 30, "max=70", id="ended"),
        # ... or while it was judged
        pytest.param([(p("It is blue."),), end(completion_tokens=30), verdicts("U")], 30, "max=70", id="ended-late"),
        # aborted: one token per text delta read, counted once
        pytest.param(
            [(*pieces(" It", " is", " blue.", kind=P), delta(" More")), verdicts("U")],
            4,
            "max=96",
            id="aborted",
        ),
    ],
)
def test_a_rounds_tokens_are_counted_once(script: list[Any], completion_tokens: int, continuation: str) -> None:
    played = play([*script, rewrite("It is red."), verdicts("F")], completion_budget=100)
    assert played.lines[-1] == f"continue content=' It is red.' {continuation}"
    assert played.core.result().usage["completion_tokens"] == completion_tokens
    assert played.core.budget.used == completion_tokens


def test_a_spent_completion_budget_ends_with_length() -> None:
    played = play(
        [(p("It is blue."), end(completion_tokens=20)), verdicts("U"), rewrite("It is red."), verdicts("F")],
        completion_budget=20,
    )
    assert played.lines[-2:] == ["step It is red.", "end length"]


def test_usage_rounds_and_regenerations_add_up_over_the_request() -> None:
    played = play(
        [
            (p("It is blue."), end(completion_tokens=7)),
            verdicts("U"),
            UNPARSEABLE,
            rewrite("It is red."),
            verdicts("F"),
            (r("So A."), end(completion_tokens=3)),
        ]
    )
    result = played.core.result()
    assert played.lines[-1] == "end stop"
    assert (result.rounds, result.regenerations, result.upstream_id) == (2, 2, "upstream-1")
    assert dict(result.usage) == {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
    assert result.steps == played.core.steps


def test_checks_and_rewrites_add_their_generator_tokens_to_the_usage() -> None:
    played = play(
        [
            (p("It is blue."), end(completion_tokens=7)),
            Checked([Verdict(Faithfulness.UNFAITHFUL, "d")], usage=Usage(3, 1)),
            Regenerated("It is red.", usage=Usage(20, 4)),
            verdicts("F"),
            (r("So A."), end(completion_tokens=3)),
        ]
    )
    assert dict(played.core.result().usage) == {"prompt_tokens": 33, "completion_tokens": 15, "total_tokens": 48}


def test_a_check_is_given_the_steps_accepted_before_it() -> None:
    """The detector's context is what the client received before the batch, never the batch itself."""
    played = play(CORRECT[0].script, **CORRECT[0].rules)
    assert [[s.text for s in c.accepted] for c in played.checks] == [
        [],  # One circle. | It is blue.
        ["One circle."],  # the rewrite of It is blue.
        ["One circle.", "It is blue."],  # the read-ahead after the kept step
    ]


def test_the_regeneration_prefix_is_the_accepted_text() -> None:
    core = new_machine(rules())
    assert isinstance(core.next_action(), StartRound)
    for item in (p("One circle."), p("It is blue.")):
        core.receive(item)
    assert isinstance(core.next_action(), Check)
    core.receive(verdicts("FU"))
    actions = [core.next_action() for _ in range(3)]
    assert isinstance(actions[1], DropRound) and isinstance(actions[2], Regenerate)
    assert actions[2].prefix == ["One circle."]


# ---- misuse ------------------------------------------------------------------------------------


def test_items_of_a_dropped_round_are_ignored() -> None:
    played = play([(p("It is blue."),), verdicts("U"), p("Read ahead."), rewrite("It is red."), verdicts("F"), end()])
    assert "Read ahead." not in " ".join(played.lines)
    assert played.lines[-1] == "end stop"


def test_results_nobody_asked_for_are_refused() -> None:
    core = new_machine(rules())
    with pytest.raises(RuntimeError):
        core.receive(verdicts("F"))
    with pytest.raises(RuntimeError):
        core.receive(rewrite("It is red."))


def test_nothing_follows_the_end() -> None:
    played = play([(end(),)])
    assert played.lines == ["start", "end stop"] and played.over
    with pytest.raises(RuntimeError):
        played.core.next_action()


# ---- a verdict that says why it is unchecked ---------------------------------------------------

BUDGET = Verdict(Faithfulness.UNKNOWN, "d", unchecked="budget")  # the judge's budget was spent


def test_an_unchecked_verdict_gives_perception_steps_its_reason() -> None:
    played = play([(p("One circle."), r("So A."), end()), Checked([BUDGET, BUDGET])])
    assert played.over and played.lines[-1] == "end stop"
    assert [(s.text, outcome(s)) for s in played.core.steps] == [
        ("One circle.", "unknown/unknown residual:unchecked unchecked:budget"),
        ("So A.", "unknown/unknown"),  # a reasoning step is never unchecked
    ]


def test_a_rewrite_that_could_not_be_checked_keeps_the_reason() -> None:
    played = play([(p("It is blue."),), verdicts("U"), rewrite("It is red."), Checked([BUDGET]), end()])
    assert "tried #1 fixed" in played.lines
    (step,) = played.core.steps
    assert outcome(step) == "unfaithful/unknown fixed@1 residual:unchecked unchecked:budget"


# ---- the sequential rule -----------------------------------------------------------------------


def test_the_sequential_rule_stops_the_model_after_each_checked_step() -> None:
    """The pipelining benchmark's baseline: one step per check, and each checked step stops the model and
    continues in a new round, whatever was read ahead (the real segmenter: "Two." is not yet whole)."""
    played = play(
        [
            (Delta("content", " One. Two. Thr"),),
            verdicts("F"),
            (Delta("content", " Two."), RoundEnd("stop", {"completion_tokens": 2})),
            verdicts("F"),
        ],
        max_batch_steps=16,
        sequential=True,
        segmenter=StepSegmenter,
        typer=lambda _: P,
    )
    lines, core = played.lines, played.core
    assert lines == [
        "start",
        "check One.",  # one step per check, though "Two." was read ahead
        "step One.",
        "drop",
        "continue content=' One.'",
        "check Two.",
        "step Two.",  # the model had finished: nothing to stop
        "end stop",
    ]
    result = core.result()
    assert result.rounds == 2
    assert result.usage["completion_tokens"] == 1 + 2  # the stopped round's one delta, then vLLM's count
    assert [s.index for s in result.steps] == [0, 1]


# ---- where a round continuing the model's own text starts ---------------------------------------

# The fixture model's blue_square chain, as vLLM streams it (no reasoning parser): the think block's close
# comes right after the last reasoning step. With the real segmenter, that step is whole only once the
# tag is read, so a round stopped then has read "\n</think>\n\n" past its last whole step.
_CHAIN = ("<think>\nThe shape is a triangle.", " So it has 3 corners.", "\n</think>", "\n\n")


def _real(**overrides: Any) -> dict[str, Any]:
    return {"segmenter": StepSegmenter, "typer": lambda text: P if "shape is" in text else R, **overrides}


def test_a_kept_step_continues_after_the_newline_and_tag_the_model_wrote() -> None:
    """The flagged step is kept after its one try; the read-ahead goes back in line and the next round
    continues from exactly what the model wrote, "\\n</think>\\n\\n" included: continued from the bare
    "corners.", the fixture model ends its reply at once and the answer is never written (a CI run lost
    it so)."""
    played = play(
        [tuple(Delta("content", t) for t in _CHAIN[:2]), (*(Delta("content", t) for t in _CHAIN[2:]), verdicts("U")),
         rewrite("Try 1."), verdicts("U"), (Delta("content", "The answer is B."), end())],
        max_retries=1, **_real(),
    )  # fmt: skip
    assert played.lines == [
        "start",
        "check The shape is a triangle.",
        "drop",
        "regenerate The shape is a triangle. #1",
        "recheck Try 1.",
        "tried #1 still_unfaithful",
        "step The shape is a triangle.",
        "continue content='<think>\\nThe shape is a triangle. So it has 3 corners.\\n</think>\\n\\n'",
        "step So it has 3 corners.",  # reasoning, not checked
        "text '\\n</think>\\n\\n'",
        "step The answer is B.",
        "end stop",
    ]


def test_a_round_that_breaks_after_the_think_block_closed_continues_in_the_answer() -> None:
    """The same text read before a break: the new round continues after the tag, not before it."""
    played = play(
        [tuple(Delta("content", t) for t in _CHAIN[:2]),
         (*(Delta("content", t) for t in _CHAIN[2:]), Delta("content", "The ans"), broke(), verdicts("F")),
         (Delta("content", "The answer is B."), end())],
        resume_attempts=1, **_real(),
    )  # fmt: skip
    assert played.lines == [
        "start",
        "check The shape is a triangle.",
        "step The shape is a triangle.",
        "step So it has 3 corners.",
        "resumed #1 resumed",
        "text '\\n</think>\\n\\n'",
        "drop",
        "continue content='<think>\\nThe shape is a triangle. So it has 3 corners.\\n</think>\\n\\n'",
        "step The answer is B.",
        "end stop",
    ]
