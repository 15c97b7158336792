from __future__ import annotations

import pytest

from faithproxy.faithcore.kinds import classify_step
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
