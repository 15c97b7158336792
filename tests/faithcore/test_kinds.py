from __future__ import annotations

import pytest

from faithproxy.faithcore.kinds import classify_step, keyword_kind, perception_probability, rule_kind
from faithproxy.faithcore.step_typer import load_model
from faithproxy.faithcore.types import StepKind

PERCEPTION = [
    "The shape is a triangle.",
    "It is a dog, not a cat.",
    "The circle is red.",
    "The square is on the left.",
    "There are three triangles.",
    "A red circle.",
    "The image shows a red car parked at 3.5 m from the curb, e.g. near Fig. 2's marker.",
    "I can see a dog sitting next to a bench.",
    'Dr. Smith\'s sign reads "STOP."',
    "Wait... the car is actually blue?",
    "In the top right corner, there is a small clock.",
    "The caption under the photo says 'Lake Tahoe'.",
    "Looking at the picture, the man is holding an umbrella.",
    "- The triangle is above the square.",
    "Okay, the image contains two cats and a dog.",
    "No, the largest shape is the hexagon.",
]

REASONING = [
    "So the answer is B.",
    "A circle has no corners.",
    "Squares have four equal sides.",
    "Therefore there are 2 more squares than circles.",
    "Let me compute $x = 3.5 \\cdot 2$.",
    "So x = 7.",
    "Okay, let me look at the image.",
    "Because a triangle has three sides, it cannot be the square.",
    "3 + 4 = 7.",
    "Option C is wrong.",
    "The answer is (B).",
    "Hmm, let me think about this again.",
    "This means the total is 12.",
    "1. First item.",
    "Since the circle is red, the correct answer is A.",
    "First, I need to look at the image.",
    "The question asks how many red cubes there are.",
]


@pytest.mark.parametrize("text", PERCEPTION)
def test_perception(text: str) -> None:
    assert classify_step(text) is StepKind.PERCEPTION


@pytest.mark.parametrize("text", REASONING)
def test_reasoning(text: str) -> None:
    assert classify_step(text) is StepKind.REASONING


def test_empty_text_is_reasoning() -> None:
    assert classify_step("") is StepKind.REASONING


# ---- the step typer beyond the keyword typer ----------------------------------------------------

# Perception without any of the keyword typer's cue words, and openers that say what the image is.
PERCEPTION_WITHOUT_KEYWORDS = [
    "A man in a suit is crossing the street.",
    "The y-axis goes from 0 to 100.",
    "A pedestrian is standing at a crosswalk.",
    "The dog is chasing a ball across the lawn.",
    "The jar has a handwritten label.",
    "Each bar has a label above it.",
]

# Sentences that open with a deduction or a plan but present the image or quote it: the rules leave them
# to the model, which types them perception.
OPENERS_THAT_CLAIM = [
    "So I have a photo of a kitchen here.",
    'Let me check the legend; it says "blue = 2021".',
]

# Reasoning the rules settle whatever the words inside (deduction, plans, the task, general knowledge).
RULED_REASONING = [
    "If the angle were 90 degrees, the triangle would be right-angled.",
    "Let me count the people.",
    "Because the bar is taller, A sold more.",
    "The question asks which city is larger.",
    "Cats have whiskers.",
]

# Reasoning the model recognises: arithmetic, self-talk, questions to oneself.
MODEL_REASONING = ["The total is 12 + 7 = 19.", "That makes sense.", "Great.", "Could it be a wolf?"]


@pytest.mark.parametrize("text", PERCEPTION_WITHOUT_KEYWORDS)
def test_perception_the_keyword_typer_missed(text: str) -> None:
    assert keyword_kind(text) is StepKind.REASONING
    assert classify_step(text) is StepKind.PERCEPTION


@pytest.mark.parametrize("text", OPENERS_THAT_CLAIM)
def test_a_deduction_or_plan_opener_that_presents_the_image_goes_to_the_model(text: str) -> None:
    assert rule_kind(text) is None
    assert classify_step(text) is StepKind.PERCEPTION


@pytest.mark.parametrize("text", RULED_REASONING)
def test_rules_settle_deduction_plans_task_and_general_knowledge(text: str) -> None:
    assert rule_kind(text) is StepKind.REASONING
    assert classify_step(text) is StepKind.REASONING


@pytest.mark.parametrize("text", MODEL_REASONING)
def test_the_model_types_arithmetic_and_self_talk_as_reasoning(text: str) -> None:
    assert rule_kind(text) is None
    assert perception_probability(text) < load_model().threshold
    assert classify_step(text) is StepKind.REASONING


def test_blank_text_is_settled_by_the_rules() -> None:
    assert rule_kind("  \n") is StepKind.REASONING
    assert classify_step("  \n") is StepKind.REASONING


def test_the_shipped_parameters_are_a_usable_model() -> None:
    model = load_model()
    assert 0.0 < model.threshold < 1.0
    assert model.weights and all(isinstance(w, float) for w in model.weights.values())
    assert load_model() is model  # read once per process
    assert 0.0 <= perception_probability("The car is red.") <= 1.0


@pytest.mark.parametrize("text", PERCEPTION)
def test_the_keyword_typer_keeps_its_perception_decisions(text: str) -> None:
    assert keyword_kind(text) is StepKind.PERCEPTION


@pytest.mark.parametrize("text", REASONING)
def test_the_keyword_typer_keeps_its_reasoning_decisions(text: str) -> None:
    assert keyword_kind(text) is StepKind.REASONING
