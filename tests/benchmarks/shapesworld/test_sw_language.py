import pytest
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.benchmarks.shapesworld.language import (
    RELATIONS,
    CountClaim,
    ObjectClaim,
    RelationClaim,
    is_reasoning,
    parse_claim,
    render_claim,
)
from faithproxy.benchmarks.shapesworld.world import COLOURS, GRID, SHAPES, SIZES, Ref

_maybe = lambda values: st.one_of(st.none(), st.sampled_from(values))  # noqa: E731
_index = st.integers(0, GRID - 1)

refs = st.builds(
    Ref,
    shape=_maybe(SHAPES),
    colour=_maybe(COLOURS),
    size=_maybe(SIZES),
    row=st.none() | _index,
    col=st.none() | _index,
)
unlocated = st.builds(Ref, shape=_maybe(SHAPES), colour=_maybe(COLOURS), size=_maybe(SIZES))
claims = st.one_of(
    st.builds(ObjectClaim, refs),
    st.builds(CountClaim, st.integers(0, 9), unlocated),
    st.builds(RelationClaim, refs, st.sampled_from(RELATIONS), refs),
)


@given(claims)
def test_render_then_parse_gives_the_claim_back(claim):
    sentence = render_claim(claim)
    assert not is_reasoning(sentence), sentence
    assert parse_claim(sentence) == claim, sentence


@pytest.mark.parametrize(
    ("sentence", "claim"),
    [
        ("There is a large red circle in the top left.", ObjectClaim(Ref("circle", "red", "large", 0, 0))),
        ("there's an orange cross on the right", ObjectClaim(Ref("cross", "orange", col=2))),
        (
            "There is a red big circle in the top left corner of the image.",
            ObjectClaim(Ref("circle", "red", "large", 0, 0)),
        ),
        ("The circle is red.", ObjectClaim(Ref("circle", "red"))),
        ("The object in the center is a small blue square.", ObjectClaim(Ref("square", "blue", "small", 1, 1))),
        ("The blue square is at the top.", ObjectClaim(Ref("square", "blue", row=0))),
        ("There are three objects in the image.", CountClaim(3, Ref())),
        ("There are no blue triangles.", CountClaim(0, Ref("triangle", "blue"))),
        ("There is no blue triangle in the image.", CountClaim(0, Ref("triangle", "blue"))),
        ("There is 1 crosses in the image.", None),  # number and noun disagree
        ("There are 2 circle in the image.", None),
        ("The red circle is a blue circle.", None),  # contradicts itself
        ("There is a shiny red circle.", None),  # outside the vocabulary
        ("The image is colourful.", None),
        ("", None),
    ],
)
def test_parse_variants(sentence, claim):
    assert parse_claim(sentence) == claim


@pytest.mark.parametrize(
    "sentence",
    [
        "So there are 2 circles in the image.",
        "Option C says 2.",
        "So the answer is 2 C.",
        "The square is blue, which matches option C.",
        "The answer is C.",
        "Therefore the red circle is on the left.",
        "So the most common colour is red, with 2 objects.",
    ],
)
def test_reasoning_sentences_are_recognised(sentence):
    assert is_reasoning(sentence)


@pytest.mark.parametrize(
    "sentence", ["There is a red circle.", "The circle is red.", "There are 2 objects in the image."]
)
def test_perception_sentences_are_not_reasoning(sentence):
    assert not is_reasoning(sentence)
