"""Answer extraction from model replies: the dresses real models use, and what must stay None."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.benchmarks.evaluation.mcq import LETTERS, extract_choice, extract_yes_no, format_options, normalize_text

OPTIONS = ["red", "blue", "green", "the correct answer is not listed"]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (r"\boxed{B}", "B"),
        (r"So the answer is $\boxed{\text{C}}$.", "C"),
        (r"\boxed{(b) blue}", "B"),
        ("<answer>B</answer>", "B"),
        ("<answer> (c) </answer>", "C"),
        ("The answer is (b)", "B"),
        ("The answer is b.", "B"),
        ("Answer: C.", "C"),
        ("Answer: C. The circle is green, as the image shows.", "C"),
        ("The final answer: **B**", "B"),
        ("The correct option is D", "D"),
        ("Option B", "B"),
        ("B", "B"),
        ("(a)", "A"),
        ("B. blue, because the shape is blue.", "B"),
        ("The answer is red.", "A"),
        ("It is green.", "C"),
        ("blue", "B"),
        # the reasoning mentions other letters; only the part after </think> decides
        ("<think>Option B looks tempting. The answer is B? No.</think>\n\nThe answer is A.", "A"),
        ("<think>\nThe circle is blue.\n</think>\n\nThe answer is B.", "B"),
        # a reasoning block that never closed: only an explicit marker inside it counts
        ("<think>Looking closely, the answer is C", "C"),
        # claims about a capital letter
        ("Therefore, option C is correct.", "C"),
        ("C is the correct answer.", "C"),
        ("I will go with (D).", "D"),
        ("Maybe B is right, but A is the correct one.", "A"),
        # the last marker wins (models often restate)
        ("The answer is A. Wait, looking again, the answer is C.", "C"),
    ],
)
def test_reads_the_chosen_letter(reply: str, expected: str) -> None:
    assert extract_choice(reply, OPTIONS) == expected


@pytest.mark.parametrize(
    "reply",
    [
        "",
        None,
        "I cannot tell from this image.",
        "A cat sits on the mat.",  # the article, not option A
        "a cat",
        "It is red or blue.",  # two options named
        "The answer is E.",  # not an option
        "<think>The circle is red, so A fits.",  # unfinished reasoning without a marker
        "<think>thinking</think>",  # nothing after the reasoning, no marker in it
        "<think>Option B is correct? Let me check the",  # a claim inside unfinished reasoning
        "Option A is wrong.",
        "a is correct",  # lower case: could be anything
    ],
)
def test_unreadable_replies_are_none(reply: str | None) -> None:
    assert extract_choice(reply, OPTIONS) is None


def test_option_named_inside_a_longer_option_picks_the_longer() -> None:
    assert extract_choice("It is dark red.", ["red", "dark red"]) == "B"
    assert extract_choice("It is red.", ["red", "dark red"]) == "A"


def test_letters_are_bounded_by_the_options() -> None:
    assert extract_choice("The answer is C.", ["yes", "no"]) is None
    assert extract_choice("The answer is C.", n_options=3) == "C"
    assert extract_choice("The answer is D.", n_options=3) is None


DRESSES = [
    "{L}",
    "({l})",
    "({L})",
    "{L}.",
    "The answer is {L}.",
    "The answer is ({l}).",
    "Answer: {L}",
    r"\boxed{{{L}}}",
    "<answer>{L}</answer>",
    "{L}. {text}",
    "The answer is {text}.",
]


@given(
    index=st.integers(min_value=0, max_value=3),
    dress=st.sampled_from(DRESSES),
    reasoning=st.text(alphabet=st.characters(codec="ascii", exclude_characters="<>\\"), max_size=80),
    trailing=st.sampled_from(["", "\n", " ", "\n\nI am confident."]),
)
def test_any_dress_after_any_reasoning_reads_the_letter(index: int, dress: str, reasoning: str, trailing: str) -> None:
    letter = LETTERS[index]
    answer = dress.format(L=letter, l=letter.lower(), text=OPTIONS[index])
    assert extract_choice(f"<think>{reasoning}</think>\n{answer}{trailing}", OPTIONS) == letter


@given(st.text(max_size=200))
def test_never_raises_and_stays_in_range(text: str) -> None:
    result = extract_choice(text, OPTIONS[:3])
    assert result is None or result in "ABC"
    assert extract_yes_no(text) in (None, "yes", "no")


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Yes, the line is longer.", "yes"),
        ("No.", "no"),
        ("The answer is no, because the bars are equal.", "no"),
        (r"\boxed{Yes}", "yes"),
        ("<answer>no</answer>", "no"),
        ("<think>yes, maybe; but no</think>\nNo", "no"),
        ("The figure shows that yes, it is.", "yes"),
        ("<think>After checking, the answer is yes", "yes"),
        ("It does not say yes or no.", None),
        ("Perhaps.", None),
        ("", None),
    ],
)
def test_yes_no(reply: str, expected: str | None) -> None:
    assert extract_yes_no(reply) == expected


def test_format_options_and_normalize() -> None:
    assert format_options(["red", "blue"]) == "A. red B. blue"
    assert normalize_text(r"  The \text{Dark} RED, circle! ") == "the dark red circle"
