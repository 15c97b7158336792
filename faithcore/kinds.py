"""The step typer: does a step claim something about the image (PERCEPTION) or not (REASONING)?

Only perception steps are checked against the image, and with the judge gate on (the server's
`judge_every_step` off) a batch without a perception step goes to no detector at all, not even to
one that types steps itself. So this typer is built for recall: a perception step it calls reasoning
is a claim nobody checks, while a reasoning step it calls perception costs one judge look.

Two stages:

1. Rules for the forms that are reasoning whatever they mention (`rule_kind`): a sentence that opens,
   after fillers such as "Okay," or "Wait,", with a deduction, a plan or the task ("So", "Therefore",
   "Because", "Let me", "I need to", "The question asks", "The answer is", "If" ...), unless it also
   presents the image or quotes text from it ("So I've got this picture of ...", "Let me check; the
   label says "Milk""); and general knowledge about a kind of thing ("A circle has no corners.",
   "Squares have four sides.") that names no image.
2. Every other sentence goes to a logistic model over faithcore.step_features (words, how the sentence
   opens, cue patterns), trained on labelled chains by benchmarks/evaluation/typer_train.py, with its
   threshold set for a cross-validated perception recall of 0.99; its parameters ship in
   faithcore/step_typer.json.

docs/step-typer.md has the figures on held-out chains and the commands. A detector that types steps
itself (the judge) still returns its own `Verdict.kind` for the steps it is sent, which overrides this.
"""

from __future__ import annotations

import re

from faithproxy.faithcore import keyword_typer as kw
from faithproxy.faithcore.keyword_typer import keyword_kind
from faithproxy.faithcore.step_features import CUES, opening
from faithproxy.faithcore.step_typer import load_model
from faithproxy.faithcore.types import StepKind

__all__ = ["classify_step", "keyword_kind", "perception_probability", "rule_kind"]

# General knowledge: an indefinite or plural subject with has/have ("A circle has no corners."). Not
# "each": "Each bar has a label." is about the bars in the image.
_GENERIC_KNOWLEDGE = re.compile(
    r"(?:(?:a|an|every|all|any)\s+\w+|\w+s)\s+(?:has|have|always|never|by definition)\b", re.IGNORECASE
)


def rule_kind(text: str) -> StepKind | None:
    """REASONING for the forms of stage 1 (see the module docstring); None: the model decides."""
    body, _ = opening(text)
    if not body:
        return StepKind.REASONING
    if kw._DEDUCTION_START.match(body) and not (CUES["presenting"].search(body) or CUES["quote"].search(body)):
        return StepKind.REASONING
    if _GENERIC_KNOWLEDGE.match(body) and not kw._IMAGE.search(body):
        return StepKind.REASONING
    return None


def perception_probability(text: str) -> float:
    """The model's P(perception) for one step's text (stage 2, whatever the rules say)."""
    return load_model().probability(text)


def classify_step(text: str) -> StepKind:
    """PERCEPTION when the step may claim something about the image (see the module docstring)."""
    ruled = rule_kind(text)
    if ruled is not None:
        return ruled
    return StepKind.PERCEPTION if load_model().is_perception(text) else StepKind.REASONING
