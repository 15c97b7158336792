"""Collaborative hint inference: the prompt, the reply parser and where the hints go."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.server.chain.hints import Hints, apply_hints, build_hint_prompt, parse_hint_reply

HINTS = Hints("counting", "Count each object once, row by row.", "Look for small triangles near the edges.")


def test_prompt_carries_the_question_and_the_reply_form() -> None:
    prompt = build_hint_prompt("  How many circles are there?\nA. 1\nB. 2 ")
    assert "How many circles are there?\nA. 1\nB. 2\n" in prompt
    assert "[Topic hint]:" in prompt and "[Question hint]:" in prompt and "counting" in prompt


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            "[Question type]: counting\n[Topic hint]: Count each object once.\n[Question hint]: Mind the corners.",
            Hints("counting", "Count each object once.", "Mind the corners."),
        ),
        (  # markdown, different case, a dash, an unknown type
            "**Question type**: Geometry\n- **Topic hint** - Compare sizes.\n**question hint:** Check the left.",
            Hints("other", "Compare sizes.", "Check the left."),
        ),
        ("[Question type]: spatial\n[Topic hint]: Rows first.", None),  # no question hint
        ("I think the answer is B.", None),
        ("", None),
    ],
)
def test_reply_parser(reply: str, expected: Hints | None) -> None:
    assert parse_hint_reply(reply) == expected


@given(st.text())
def test_reply_parser_never_raises(reply: str) -> None:
    result = parse_hint_reply(reply)
    assert result is None or (result.topic_hint and result.question_hint)


def test_hints_surround_the_question_and_images_stay() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [image, {"type": "text", "text": "How many circles?"}]},
    ]
    out = apply_hints(messages, HINTS)
    assert messages[1]["content"][1]["text"] == "How many circles?"  # the request itself is untouched
    assert out[0] == messages[0] and out[1]["content"][0] == image
    text = out[1]["content"][1]["text"]
    assert text.index(HINTS.topic_hint) < text.index("How many circles?") < text.index(HINTS.question_hint)


def test_string_content_and_several_text_parts() -> None:
    out = apply_hints([{"role": "user", "content": "Q?"}], HINTS)
    topic, question = f"Hint about this kind of question: {HINTS.topic_hint}", f"Hint: {HINTS.question_hint}"
    assert out[0]["content"] == f"{topic}\n\nQ?\n\n{question}"
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    out = apply_hints([{"role": "user", "content": parts}], HINTS)
    assert out[0]["content"][0]["text"].endswith("first") and HINTS.topic_hint in out[0]["content"][0]["text"]
    assert out[0]["content"][1]["text"].startswith("second") and HINTS.question_hint in out[0]["content"][1]["text"]


def test_only_the_last_user_turn_changes() -> None:
    messages = [
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": "new question"},
    ]
    out = apply_hints(messages, HINTS)
    assert out[:2] == messages[:2] and "new question" in out[2]["content"] and HINTS.topic_hint in out[2]["content"]
    assert apply_hints([{"role": "assistant", "content": "x"}], HINTS) == [{"role": "assistant", "content": "x"}]
