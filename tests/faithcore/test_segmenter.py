from __future__ import annotations

import nltk
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import faithproxy.faithcore.segmenter as segmenter_module
from faithproxy.faithcore.segmenter import StepSegmenter, segment_text
from faithproxy.faithcore.types import Segment

QWEN_CHAIN = (
    "<think>\nOkay, let me look at the image. The image shows a red car parked at 3.5 m from the curb, "
    "e.g. near Fig. 2's marker. Dr. Smith's sign reads \"STOP.\" Wait... the car is actually blue? "
    "Let me compute $x = 3.5 \\cdot 2$. So x = 7.\n\n1. First item.\n2. Second item.\n</think>\n\n"
    "The answer is (B)."
)


def texts(text: str) -> list[str]:
    return [segment.text for segment in segment_text(text) if segment.text]


def feed_in_pieces(pieces: list[str], start_index: int = 0) -> tuple[list[Segment], list[Segment]]:
    """(segments from all feeds, segments from the flush)."""
    segmenter = StepSegmenter(start_index)
    fed = [segment for piece in pieces for segment in segmenter.feed(piece)]
    return fed, segmenter.flush()


# -- realistic chains ---------------------------------------------------------------------------


def test_qwen_chain() -> None:
    segments = segment_text(QWEN_CHAIN)
    assert [(s.text, s.raw) for s in segments] == [
        ("Okay, let me look at the image.", "<think>\nOkay, let me look at the image."),
        (
            "The image shows a red car parked at 3.5 m from the curb, e.g. near Fig. 2's marker.",
            " The image shows a red car parked at 3.5 m from the curb, e.g. near Fig. 2's marker.",
        ),
        ('Dr. Smith\'s sign reads "STOP."', ' Dr. Smith\'s sign reads "STOP."'),
        ("Wait... the car is actually blue?", " Wait... the car is actually blue?"),
        ("Let me compute $x = 3.5 \\cdot 2$.", " Let me compute $x = 3.5 \\cdot 2$."),
        ("So x = 7.", " So x = 7."),
        ("1. First item.", "\n\n1. First item."),
        ("2. Second item.", "\n2. Second item."),
        ("The answer is (B).", "\n</think>\n\nThe answer is (B)."),
    ]
    assert [s.index for s in segments] == list(range(9))


def test_contract_example_from_the_issue() -> None:
    segments = segment_text("<think>\nA red circle. It is big.\n</think>\n\nThe answer is A.")
    assert [s.raw for s in segments] == ["<think>\nA red circle.", " It is big.", "\n</think>\n\nThe answer is A."]
    assert [s.text for s in segments] == ["A red circle.", "It is big.", "The answer is A."]


def test_qwen_chain_fed_token_by_token_emits_steps_while_streaming() -> None:
    segmenter = StepSegmenter()
    emitted_at = []
    for i in range(len(QWEN_CHAIN)):
        for segment in segmenter.feed(QWEN_CHAIN[i]):
            emitted_at.append((segment.text, i))
    tail = segmenter.flush()
    assert [text for text, _ in emitted_at] == [s.text for s in segment_text(QWEN_CHAIN)][:-1]
    assert [s.text for s in tail] == ["The answer is (B)."]
    # The first step leaves as soon as the next word ("The") is complete.
    assert emitted_at[0][1] == QWEN_CHAIN.index("The image") + len("The ") - 1


# -- sentence rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The rod is 3.5 cm long. It is red.", ["The rod is 3.5 cm long.", "It is red."]),
        ("Shapes, e.g. circles, are round. Next one.", ["Shapes, e.g. circles, are round.", "Next one."]),
        ("Use a key, i.e. the blue one. Done.", ["Use a key, i.e. the blue one.", "Done."]),
        ("See Fig. 2 for details. Also Eq. 3 holds.", ["See Fig. 2 for details.", "Also Eq. 3 holds."]),
        ("Dr. Smith and Mr. Jones met Prof. Lee.", ["Dr. Smith and Mr. Jones met Prof. Lee."]),
        ("Circles vs. squares. They differ.", ["Circles vs. squares.", "They differ."]),
        ("Cats, dogs, etc. are here. Birds too.", ["Cats, dogs, etc. are here.", "Birds too."]),
        ("Cats, dogs, etc. The end.", ["Cats, dogs, etc.", "The end."]),
        ("It is approx. 3 m wide. Ok.", ["It is approx. 3 m wide.", "Ok."]),
        ('It says "STOP." Then it ends.', ['It says "STOP."', "Then it ends."]),
        ("It says \u201cSTOP.\u201d Then it ends.", ["It says \u201cSTOP.\u201d", "Then it ends."]),
        ("(See the left side.) The right is empty.", ["(See the left side.)", "The right is empty."]),
        ("Wait... the car is blue.", ["Wait... the car is blue."]),
        ("Wait... The car is blue.", ["Wait...", "The car is blue."]),
        ("Wait\u2026 the car is blue.", ["Wait\u2026 the car is blue."]),
        ("Wait\u2026 The car is blue. Yes.", ["Wait\u2026", "The car is blue.", "Yes."]),
        ("Is it red? No. It is blue!", ["Is it red?", "No.", "It is blue!"]),
        ("The answer is B. Cats are not shown.", ["The answer is B.", "Cats are not shown."]),
        ("Step 2. Then we stop.", ["Step 2.", "Then we stop."]),
        (
            "It is 5 p.m. in the photo. At 6 p.m. The sun sets.",
            ["It is 5 p.m. in the photo.", "At 6 p.m.", "The sun sets."],
        ),
        ("**Step 1.** Identify the shapes.", ["**Step 1.**", "Identify the shapes."]),
        ("No end here", ["No end here"]),
    ],
)
def test_sentences(text: str, expected: list[str]) -> None:
    assert texts(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Let $a. B$ hold. Next.", ["Let $a. B$ hold.", "Next."]),
        ("Let $$a. B$$ hold. Next.", ["Let $$a. B$$ hold.", "Next."]),
        ("Let \\(a. B\\) hold. Next.", ["Let \\(a. B\\) hold.", "Next."]),
        ("Let \\[a. B\\] hold. Next.", ["Let \\[a. B\\] hold.", "Next."]),
        ("So $x = 3.5 \\cdot 2$. So x = 7.", ["So $x = 3.5 \\cdot 2$.", "So x = 7."]),
        # Money is not math: the dollar signs must not swallow the sentence end.
        ("It costs $5. Then $3 more.", ["It costs $5.", "Then $3 more."]),
        # A lone dollar is literal text once the block has ended.
        ("A $ sign. Next one.", ["A $ sign.", "Next one."]),
        ("Unclosed $a. B here.\n\nNew block.", ["Unclosed $a.", "B here.", "New block."]),
    ],
)
def test_latex_is_never_split(text: str, expected: list[str]) -> None:
    assert texts(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("First para\n\nSecond para", ["First para", "Second para"]),
        ("One line\n  \t\nnext", ["One line", "next"]),
        ("Soft\nwrap stays.", ["Soft\nwrap stays."]),
        ("Shapes:\n- a circle\n- a square", ["Shapes:", "- a circle", "- a square"]),
        ("Shapes:\n* a circle\n+ a square", ["Shapes:", "* a circle", "+ a square"]),
        ("Steps:\n1. Look.\n2) Count.\n10. Answer.", ["Steps:", "1. Look.", "2) Count.", "10. Answer."]),
        ("Options:\nA. red\nB. blue\n(C) green", ["Options:", "A. red", "B. blue", "(C) green"]),
        ("Nested:\n  - inner item", ["Nested:", "- inner item"]),
        ("1. First item. It has two parts.", ["1. First item.", "It has two parts."]),
        ("Not a list\n-3 is negative.", ["Not a list\n-3 is negative."]),
        ("Value\n3.5 cm.", ["Value\n3.5 cm."]),
        ("**Step 1: Look**\nThe cube is red.", ["**Step 1: Look**", "The cube is red."]),
        ("Let me count:\nThere are two.", ["Let me count:", "There are two."]),
        ("## Shapes\nThe cube is red.\n### Colours", ["## Shapes", "The cube is red.", "### Colours"]),
        ("Not #1 heading\nhere.", ["Not #1 heading\nhere."]),
    ],
)
def test_blocks(text: str, expected: list[str]) -> None:
    assert texts(text) == expected


def test_tags_are_boundaries_and_live_only_in_raw() -> None:
    segments = segment_text("<think>Thinking here</think>Answer here")
    assert [(s.text, s.raw) for s in segments] == [
        ("Thinking here", "<think>Thinking here"),
        ("Answer here", "</think>Answer here"),
    ]


def test_trailing_whitespace_and_tags_come_back_as_one_empty_segment() -> None:
    fed, flushed = feed_in_pieces(["<think>\nA red circle.\n</think>\n"])
    assert fed == [Segment(0, "A red circle.", "<think>\nA red circle.")]  # the tag ended it
    assert flushed == [Segment(1, "", "\n</think>\n")]


def test_only_tags_and_whitespace() -> None:
    assert segment_text("<think>\n\n</think>") == [Segment(0, "", "<think>\n\n</think>")]
    assert segment_text("") == []


def test_partial_tag_at_the_end_is_text() -> None:
    assert [(s.text, s.raw) for s in segment_text("Done. </thi")] == [("Done.", "Done."), ("</thi", " </thi")]


def test_the_settled_lead_is_the_whitespace_and_whole_tags_read_past_the_last_step() -> None:
    segmenter = StepSegmenter()
    assert segmenter.feed("<think>\nA red circle.\n</thi") == []  # a partial tag could still be text
    assert segmenter.settled_lead() == "<think>\n"  # no step has been cut yet
    assert [s.text for s in segmenter.feed("nk>\n\nThe ans")] == ["A red circle."]
    assert segmenter.settled_lead() == "\n</think>\n\n"
    assert [s.text for s in segmenter.feed("wer is A. It is")] == ["The answer is A."]
    assert segmenter.settled_lead() == " "


# -- incremental behaviour ---------------------------------------------------------------------


def test_a_sentence_waits_for_the_next_complete_word() -> None:
    segmenter = StepSegmenter()
    assert segmenter.feed("A red circle.") == []
    assert segmenter.feed(" It") == []  # "It" could still grow into "It." after an abbreviation...
    assert segmenter.feed(" is") == [Segment(0, "A red circle.", "A red circle.")]
    assert segmenter.flush() == [Segment(1, "It is", " It is")]


def test_abbreviation_is_not_emitted_early() -> None:
    segmenter = StepSegmenter()
    assert segmenter.feed("See Fig") == []
    assert segmenter.feed(". 2 for it. ") == []
    assert segmenter.feed("Then more ") == [Segment(0, "See Fig. 2 for it.", "See Fig. 2 for it.")]


def test_a_tag_ends_a_step_at_once() -> None:
    segmenter = StepSegmenter()
    assert segmenter.feed("The circle is red") == []
    assert segmenter.feed("</thi") == []
    assert segmenter.feed("nk>") == [Segment(0, "The circle is red", "The circle is red")]


def test_open_latex_holds_back_later_steps() -> None:
    segmenter = StepSegmenter()
    assert segmenter.feed("Compute $a. B c. D e ") == []
    assert segmenter.feed("f$ now. Done. Next ") == [
        Segment(0, "Compute $a. B c. D e f$ now.", "Compute $a. B c. D e f$ now."),
        Segment(1, "Done.", " Done."),
    ]


def test_indices_start_at_start_index_and_run_across_calls() -> None:
    fed, flushed = feed_in_pieces(["One. Two. ", "Three. Four"], start_index=5)
    assert [s.index for s in fed + flushed] == [5, 6, 7, 8]
    assert [s.text for s in fed + flushed] == ["One.", "Two.", "Three.", "Four"]


def test_the_segmenter_is_reusable_after_flush() -> None:
    segmenter = StepSegmenter()
    assert [s.text for s in segmenter.feed("One. Two. ") + segmenter.flush()] == ["One.", "Two.", ""]
    assert segmenter.feed("Three. Four.") + segmenter.flush() == [
        Segment(3, "Three.", "Three."),
        Segment(4, "Four.", " Four."),
    ]


def test_long_paragraph_without_an_end_is_not_retokenised(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = segmenter_module._punkt_ends

    def recording(text: str, closed: bool) -> list[int]:
        seen.append(len(text))
        return real(text, closed)

    monkeypatch.setattr(segmenter_module, "_punkt_ends", recording)
    segmenter = StepSegmenter()
    paragraph = "the red cube e.g. sits left of Dr. Lee's blue ball " * 200
    for word in paragraph.split():
        assert segmenter.feed(word + " ") == []
    assert max(seen) < 100  # Punkt reads the last few words, not the 10 kB paragraph
    assert [s.text for s in segmenter.flush()] == [paragraph.strip(), ""]


def test_no_punkt_data_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the segmenter must not load or download nltk data")

    monkeypatch.setattr(nltk, "download", forbidden)
    monkeypatch.setattr(nltk.data, "load", forbidden)
    monkeypatch.setattr(nltk.data, "find", forbidden)
    assert texts("One. Two.") == ["One.", "Two."]


# -- properties ---------------------------------------------------------------------------------

_WORDS = ["the", "red", "circle", "is", "left", "of", "a", "cube", "Wait", "So", "It", "There", "I", "B"]
_PIECES = [
    ". ", "? ", "! ", "... ", "\u2026 ", ".", "?", "...", "\u2026", ", ", " ", "  ", "\n", "\n\n", "\n \n",
    "3.5", "7.", "2", "e.g.", "i.e.", "etc.", "Fig.", "Dr.", "Mr.", "vs.", "No.", "approx.", "B.",
    "\"STOP.\"", "\u201cGo.\u201d", "(see left.)", "'", "\"", ")", "<think>", "</think>", "<think>\n",
    "\n</think>\n\n", "<", "</", "\n- ", "\n* ", "\n1. ", "\n2) ", "\n(A) ", "\nA. ", "\n  - ", "$x = 3.5$",
    "\n## ", "#", ":", ":\n", "**\n", "p.m.",
    "$a. B$", "$$a. B$$", "\\(a. B\\)", "\\[x. Y\\]", "$", "$$", "\\", "$5", "$3.50", "\\$", "**", "\t",
]  # fmt: skip
_realistic = st.lists(st.sampled_from(_WORDS + _PIECES), max_size=60).map(" ".join) | st.lists(
    st.sampled_from(_WORDS + _PIECES), max_size=60
).map("".join)
_noisy = st.text(alphabet=st.sampled_from(list("aBt .?!\u2026\"')($\\\n\t<>/thinkTHINK-*12(A)")), max_size=80)
_any_text = _realistic | _noisy | st.text(max_size=60)


@st.composite
def text_and_pieces(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(_any_text)
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=max(1, len(text)))))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


_PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY
@given(text_and_pieces())
def test_any_chunking_gives_the_same_segments(case: tuple[str, list[str]]) -> None:
    text, pieces = case
    fed, flushed = feed_in_pieces(pieces)
    assert [(s.text, s.raw) for s in fed + flushed] == [(s.text, s.raw) for s in segment_text(text)]


@_PROPERTY
@given(text_and_pieces())
def test_segments_are_well_formed(case: tuple[str, list[str]]) -> None:
    text, pieces = case
    fed, flushed = feed_in_pieces(pieces, start_index=3)
    segments = fed + flushed
    assert "".join(s.raw for s in segments) == text
    assert [s.index for s in segments] == list(range(3, 3 + len(segments)))
    assert all(s.text for s in fed)
    assert all(s.text for s in flushed[:-1])
    for s in segments:
        assert s.text == s.text.strip()
        assert "<think>" not in s.text and "</think>" not in s.text
        assert s.raw.endswith(s.text)


@_PROPERTY
@given(st.lists(st.sampled_from(_WORDS + _PIECES), max_size=40).map(" ".join))
def test_one_character_at_a_time(text: str) -> None:
    fed, flushed = feed_in_pieces(list(text))
    assert [(s.text, s.raw) for s in fed + flushed] == [(s.text, s.raw) for s in segment_text(text)]
