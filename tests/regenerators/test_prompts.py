"""Regeneration prompt structure and the bracketed-reply parser."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.regenerators.prompts import build_regeneration_prompt, parse_bracketed


def test_prompt_carries_question_prefix_and_flagged_step() -> None:
    prompt = build_regeneration_prompt(
        "What colour is the car?", ["The image shows a car.", "It is parked."], "The car is blue."
    )
    assert "What colour is the car?" in prompt
    assert "The image shows a car.\nIt is parked." in prompt
    assert "The car is blue." in prompt
    assert "square brackets" in prompt
    assert prompt.index("It is parked.") < prompt.index("The car is blue.")


def test_empty_prefix_is_explicit() -> None:
    assert "(none)" in build_regeneration_prompt("Q?", [], "Bad.")


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("[The car is red.]", "The car is red."),
        ("Corrected: [ The car is red. ]\n", "The car is red."),
        ('The step "[The car is blue.]" is wrong. Fixed: [The car is red.]', "The car is red."),
        ("The car is red.", None),
        ("[]", None),
        ("[   ]", None),
        ("[unclosed", None),
    ],
)
def test_parse_bracketed(reply: str, expected: str | None) -> None:
    assert parse_bracketed(reply) == expected


@given(st.text())
def test_parser_never_raises(reply: str) -> None:
    result = parse_bracketed(reply)
    assert result is None or (result and result == result.strip())
