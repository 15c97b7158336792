"""Self-assessment prompt and reply parsing."""

import pytest

from faithproxy.detectors.self_check_prompt import build_self_check_prompt, parse_self_check


def test_prompt_shape() -> None:
    prompt = build_self_check_prompt("Q?", ["A."], "B.")
    assert "Q?" in prompt and "A." in prompt and "Next step: B." in prompt and "FAITHFUL or UNFAITHFUL" in prompt


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("FAITHFUL", True),
        ("UNFAITHFUL", False),
        ("unfaithful.", False),
        ("**Faithful**", True),
        ("It is UNFAITHFUL", False),
        ("maybe", None),
        ("", None),
    ],
)
def test_parse(reply: str, expected: bool | None) -> None:
    assert parse_self_check(reply) is expected
