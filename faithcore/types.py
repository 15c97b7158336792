"""Domain vocabulary shared by the server, detectors, regenerators and benchmarks."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class StepKind(enum.StrEnum):
    """Perception steps claim something about the image; faithfulness is defined only for them."""

    PERCEPTION = "perception"
    REASONING = "reasoning"


class Faithfulness(enum.StrEnum):
    FAITHFUL = "faithful"
    UNFAITHFUL = "unfaithful"
    # The detector could not decide (error, skipped, not reached in a batched call).
    UNKNOWN = "unknown"
    # A flag the detector was not sure enough of (its confidence under the request's threshold):
    # delivered as such, never rewritten, not counted as unfaithful.
    UNSURE = "unsure"


class Channel(enum.StrEnum):
    """Where the upstream put the text: vLLM's reasoning parser moves thinking into `reasoning`."""

    REASONING = "reasoning"
    CONTENT = "content"


@dataclass(frozen=True)
class Segment:
    """One step as the segmenter cut it.

    `raw` is the exact source text the step consumed (leading whitespace, `<think>` tags, trailing
    separators included), so that concatenating the `raw` of every segment gives back the input.
    `text` is the step itself, stripped of tags and surrounding whitespace.
    """

    index: int
    text: str
    raw: str


@dataclass(frozen=True)
class Verdict:
    """A detector's judgement of one step."""

    faithfulness: Faithfulness
    detector: str
    kind: StepKind | None = None  # the detector's typing, when it types steps itself (the judge does)
    reason: str | None = None
    latency_s: float = 0.0
    score: float | None = None  # P(unfaithful) when the detector has one (probe)
    # P(UNFAITHFUL) of a judge's flag, read from its token log-probabilities; None: unknown (a judge
    # without log-probabilities, or a verdict that is not a flag)
    confidence: float | None = None
    # Why an UNKNOWN verdict was given without asking, when the detector says so (the judge's "budget"):
    # the step's unchecked reason, instead of the default the session would assume.
    unchecked: str | None = None

    @property
    def unfaithful(self) -> bool:
        return self.faithfulness is Faithfulness.UNFAITHFUL


@dataclass
class Step:
    """A step of a chain as the session tracks it."""

    index: int
    text: str
    raw: str
    channel: Channel = Channel.CONTENT
    kind: StepKind = StepKind.REASONING
    # The step typer's kind, kept when a detector that types steps retyped it: that typing came with a
    # verdict, and a step whose verdict is discarded to be checked again (a kept step's read-ahead) goes
    # back to it, as it was read.
    typed_kind: StepKind | None = None
    verdict: Verdict | None = None  # the final verdict (of the corrected text, when it was rewritten)
    first_verdict: Verdict | None = None  # the verdict the model's ORIGINAL text got: detected UPR counts it
    attempts: int = 0  # regeneration tries spent on this step
    original_text: str | None = None  # the text before regeneration, when it was rewritten
    rejected: list[str] = field(default_factory=list)  # regenerated candidates that failed the check
    residual: bool = False  # still unfaithful (or unchecked) when it was emitted
    residual_reason: str | None = None  # regeneration_failed | not_corrected | unchecked
    unchecked_reason: str | None = None
    # Hidden-state features of the ORIGINAL text (a numpy vector), when a probe or the feature recorder
    # read them; written to the trace for training probes.
    features: Any = field(default=None, repr=False)
