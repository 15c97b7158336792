"""The rules of one request, fixed when it starts: what the machine may do and how it reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from faithproxy.faithcore.correction.rounds import SegmenterLike
from faithproxy.faithcore.kinds import classify_step
from faithproxy.faithcore.reasoning_formats import FORMATS, ReasoningFormat
from faithproxy.faithcore.segmenter import StepSegmenter
from faithproxy.faithcore.types import StepKind


@dataclass(frozen=True)
class Rules:
    mode: Literal["correct", "detect"]
    detector: str  # its name, for the verdicts the machine writes itself (never compared)
    max_retries: int = 3  # K
    max_regenerations: int = 16  # regeneration tries one request may spend
    max_batch_steps: int = 16
    on_detector_error: Literal["pass", "fail"] = "pass"
    detector_gives_verdicts: bool = True  # Detector.gives_verdicts: False for `none`, whose UNKNOWN is no error
    detector_types_steps: bool = False  # Detector.types_steps: it gets batches without perception steps
    # The judge gate (Settings.judge_every_step off): a batch in which the step typer found no perception
    # step goes to no detector, not even one that types steps itself; its steps leave unchecked, `gated`.
    gate_without_perception: bool = False
    completion_budget: int | None = None  # the client's max_tokens / max_completion_tokens
    # Where the model writes its thinking and how its template renders a partial message (continuations).
    reasoning_format: ReasoningFormat = FORMATS["think"]
    # The strictly sequential loop the pipelining benchmark compares against: one step per batch, and
    # the model is stopped after every checked step and continued in a new round, as after a correction.
    sequential: bool = False
    # How many times one request continues after its upstream stream broke mid-round (machine.py: resume).
    resume_attempts: int = 0
    # How a round's text is cut into steps and typed: the real segmenter and typer; tests may state the
    # cuts and kinds of a recorded script instead.
    segmenter: Callable[..., SegmenterLike] = StepSegmenter
    typer: Callable[[str], StepKind] = classify_step

    @property
    def batch_limit(self) -> int:
        """Steps per detector call: at least the step at the batch's head, one in the sequential loop."""
        return 1 if self.sequential else max(1, self.max_batch_steps)
