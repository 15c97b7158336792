"""The judge prompt reads back exactly, and the reply parser copes with what judges really write."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.detectors.judge_prompt import (
    JudgeReply,
    build_judge_prompt,
    parse_judge_prompt,
    parse_judge_prompt_details,
    parse_judge_reply,
)
from faithproxy.faithcore.errors import DetectorError
from faithproxy.faithcore.types import StepKind

P, R = StepKind.PERCEPTION, StepKind.REASONING
CHAIN = [
    "The image shows a man standing next to a bicycle.",
    "The man wears a red scarf.",
    "The bicycle has a basket on the front.",
    "So the man is probably going shopping.",
]

# ------------------------------------------------------------------------------------------- prompt


def test_prompt_has_the_table_15_structure() -> None:
    prompt = build_judge_prompt("What does the man wear?", CHAIN)
    assert prompt.startswith("Question:\nWhat does the man wear?\n")
    assert "Sentence 1: The image shows a man standing next to a bicycle." in prompt
    assert "Sentence 4: So the man is probably going shopping." in prompt
    for needle in (
        "describe it briefly",
        "PERCEPTION",
        "REASONING",
        "matters for answering the question",
        "FIRST unfaithful",
        "[Faithfulness]: FAITHFUL or UNFAITHFUL",
        "[Faithful reasoning chain prefix]:",
        "[First unfaithful sentence]:",
    ):
        assert needle in prompt
    assert "checked before" not in prompt and "earlier look" not in prompt


def test_prompt_reads_back() -> None:
    question = "Look closely.\n\nWhich option (A or B) is right?"
    sentences = ["First\nline  with   gaps.", "Sentence 2: quoted inside.", ""]
    prompt = build_judge_prompt(question, sentences, already_checked=2, image_hint="A red\ncar.")
    parsed = parse_judge_prompt_details(prompt)
    assert parsed.question == question
    assert parsed.sentences == ["First line with gaps.", "Sentence 2: quoted inside.", ""]
    assert parsed.already_checked == 2
    assert parsed.image_hint == "A red car."
    assert parse_judge_prompt(prompt) == (question, parsed.sentences)


@given(
    question=st.text(min_size=1).filter(lambda q: q.strip() and "Reasoning chain so far" not in q),
    sentences=st.lists(st.text(), max_size=6),
    data=st.data(),
)
def test_prompt_round_trip_property(question: str, sentences: list[str], data: st.DataObject) -> None:
    checked = data.draw(st.integers(0, len(sentences)))
    prompt = build_judge_prompt(question, sentences, already_checked=checked)
    parsed = parse_judge_prompt_details(prompt)
    assert parsed.question == question.strip()
    assert parsed.sentences == [" ".join(s.split()) for s in sentences]
    assert parsed.already_checked == checked


@pytest.mark.parametrize("text", ["", "hello", "Question:\nwhat?\n\nno chain here", "Question:\nq\n"])
def test_parse_prompt_rejects_other_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse_judge_prompt(text)


def test_build_prompt_rejects_bad_checked_count() -> None:
    with pytest.raises(ValueError):
        build_judge_prompt("q", ["a"], already_checked=2)


# -------------------------------------------------------------------------------------------- reply

CLEAN_UNFAITHFUL = """\
[Image description]: A man in a red hat stands beside a bicycle with a basket.
Sentence 1: PERCEPTION
Sentence 2: PERCEPTION
Sentence 3: PERCEPTION
Sentence 4: REASONING
[Faithfulness]: UNFAITHFUL
[Faithful reasoning chain prefix]: 1
[First unfaithful sentence]: Sentence 2: The man wears a red scarf."""


def test_clean_reply() -> None:
    reply = parse_judge_reply(CLEAN_UNFAITHFUL, CHAIN)
    assert reply == JudgeReply(
        kinds={0: P, 1: P, 2: P, 3: R},
        first_unfaithful=1,
        description="A man in a red hat stands beside a bicycle with a basket.",
    )


def test_faithful_reply_has_no_index() -> None:
    text = "Sentence 1: PERCEPTION\n[Faithfulness]: FAITHFUL\n[Faithful reasoning chain prefix]: 1-4\n"
    text += "[First unfaithful sentence]:"
    reply = parse_judge_reply(text, CHAIN)
    assert reply.first_unfaithful is None and reply.kinds == {0: P} and reply.description is None


MESSY_REPLIES = {
    "markdown bold": """\
**[Image description]:** A man and a bike.
**Sentence 1:** PERCEPTION
**Sentence 2:** **PERCEPTION**
**Sentence 3:** PERCEPTION
**Sentence 4:** REASONING
**[Faithfulness]:** **UNFAITHFUL**
**[Faithful reasoning chain prefix]:** Sentence 1
**[First unfaithful sentence]:** "The man wears a red scarf."
""",
    "no brackets, lower case, extra spaces": """\
image description:   a man and a bike
sentence 1 :  perception
sentence 2:perception
faithfulness :   unfaithful
faithful reasoning chain prefix: 1
first unfaithful sentence:    sentence 2
""",
    "quoted text only": """\
[Faithfulness]: UNFAITHFUL
[First unfaithful sentence]: “The man wears a red scarf”
""",
    "text with different case and punctuation": """\
[Faithfulness]: Unfaithful
[First unfaithful sentence]: the MAN wears a red scarf!!
""",
    "fuzzy text": """\
[Faithfulness]: UNFAITHFUL
[First unfaithful sentence]: The man is wearing a red scarf.
""",
    "value on the next line": """\
[Faithfulness]:
UNFAITHFUL
[First unfaithful sentence]:
Sentence 2: The man wears a red scarf.
""",
    "bare number": "[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: 2\n",
    "hash number": "[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: #2\n",
    "bullets and headings": """\
## Verdict
- [Faithfulness]: UNFAITHFUL
- [First unfaithful sentence]: [Sentence 2] The man wears a red scarf.
""",
    "number wins over text": """\
[Faithfulness]: UNFAITHFUL
[First unfaithful sentence]: Sentence 2: The bicycle has a basket on the front.
""",
    "block format of the evaluation prompt": """\
Sentence 1: "The image shows a man standing next to a bicycle."
Type: PERCEPTION
Faithfulness: FAITHFUL
Sentence 2: "The man wears a red scarf."
Type: PERCEPTION
Faithfulness: UNFAITHFUL
Sentence 4: "So the man is probably going shopping."
Type: REASONING
""",
    "not faithful": "[Faithfulness]: NOT FAITHFUL\n[First unfaithful sentence]: Sentence 2\n",
    "crlf": "[Faithfulness]: UNFAITHFUL\r\n[First unfaithful sentence]: Sentence 2\r\n",
}


@pytest.mark.parametrize("text", MESSY_REPLIES.values(), ids=MESSY_REPLIES.keys())
def test_messy_replies_find_sentence_2(text: str) -> None:
    assert parse_judge_reply(text, CHAIN).first_unfaithful == 1


def test_reply_with_unlabelled_description_and_text_fields() -> None:
    """The shape the deterministic shapesworld judge writes: description first, fields hold texts."""
    text = """\
The image shows 2 objects: a large red circle in the top left and a small blue square in the centre.
Sentence 1: PERCEPTION
Sentence 2: PERCEPTION
Sentence 3: REASONING
[Faithfulness]: UNFAITHFUL
[Faithful reasoning chain prefix]: There are 2 objects in the image.
[First unfaithful sentence]: There is a large green circle in the top left."""
    chain = [
        "There are 2 objects in the image.",
        "There is a large green circle in the top left.",
        "So the answer is A.",
    ]
    reply = parse_judge_reply(text, chain)
    assert reply.first_unfaithful == 1 and reply.kinds == {0: P, 1: P, 2: R}
    assert reply.description is not None and reply.description.startswith("The image shows 2 objects:")


def test_preamble_ending_in_a_colon_is_not_a_description() -> None:
    reply = parse_judge_reply("Here is my analysis:\n[Faithfulness]: FAITHFUL", CHAIN)
    assert reply.description is None


def test_typing_in_messy_and_block_replies() -> None:
    assert parse_judge_reply(MESSY_REPLIES["markdown bold"], CHAIN).kinds == {0: P, 1: P, 2: P, 3: R}
    assert parse_judge_reply(MESSY_REPLIES["block format of the evaluation prompt"], CHAIN).kinds == {
        0: P,
        1: P,
        3: R,
    }
    inline = "Sentence 1: The image shows a man. - PERCEPTION\nSentence 2 (REASONING)\n[Faithfulness]: FAITHFUL"
    assert parse_judge_reply(inline, CHAIN).kinds == {0: P, 1: R}


def test_typing_lines_out_of_range_are_ignored() -> None:
    text = "Sentence 9: PERCEPTION\nSentence 0: REASONING\n[Faithfulness]: FAITHFUL"
    assert parse_judge_reply(text, CHAIN).kinds == {}


@pytest.mark.parametrize("blank", ["", "None", "N/A", "-", "(none)", "none.", '""', "**None**"])
def test_faithful_with_blank_first_field(blank: str) -> None:
    text = f"[Faithfulness]: FAITHFUL\n[First unfaithful sentence]: {blank}"
    assert parse_judge_reply(text, CHAIN).first_unfaithful is None


def test_faithful_verdict_wins_over_an_echoed_sentence() -> None:
    text = "[Faithfulness]: FAITHFUL\n[First unfaithful sentence]: Sentence 4: So the man is probably going shopping."
    assert parse_judge_reply(text, CHAIN).first_unfaithful is None


def test_out_of_range_number_falls_back_to_text() -> None:
    text = "[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: Sentence 7: The man wears a red scarf."
    assert parse_judge_reply(text, CHAIN).first_unfaithful == 1


def test_sentence_starting_with_a_digit_is_matched_by_text() -> None:
    chain = ["There are two dogs.", "3 cats sit on the sofa.", "So there are 5 animals."]
    text = "[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: 3 cats sit on the sofa."
    assert parse_judge_reply(text, chain).first_unfaithful == 1


UNPARSEABLE = {
    "no fields": "I am not sure what you would like me to do with this picture.",
    "empty": "",
    "faithfulness without a verdict": "[Faithfulness]: maybe\n[First unfaithful sentence]: 2",
    "unfaithful without sentence": "[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]:",
    "unfaithful without the field": "[Faithfulness]: UNFAITHFUL\n",
    "unfaithful, unknown text": "[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: The sky is green.",
    "unfaithful, out of range only": "[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: Sentence 12",
}


@pytest.mark.parametrize("text", UNPARSEABLE.values(), ids=UNPARSEABLE.keys())
def test_unparseable_replies_raise_detector_error(text: str) -> None:
    with pytest.raises(DetectorError) as info:
        parse_judge_reply(text, CHAIN)
    assert info.value.code == "unparseable"


def test_non_text_reply_raises_detector_error() -> None:
    with pytest.raises(DetectorError):
        parse_judge_reply(None, CHAIN)  # type: ignore[arg-type]


@given(reply=st.text(), sentences=st.lists(st.text(), max_size=5))
def test_parser_raises_only_detector_error(reply: str, sentences: list[str]) -> None:
    try:
        parsed = parse_judge_reply(reply, sentences)
    except DetectorError as exc:
        assert exc.code == "unparseable"
        return
    assert parsed.first_unfaithful is None or 0 <= parsed.first_unfaithful < len(sentences)
    assert all(0 <= k < len(sentences) for k in parsed.kinds)


_WORDS = st.lists(st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJ", min_size=1, max_size=8), min_size=2)
_FIELD_TEXT = st.lists(
    _WORDS.map(" ".join).filter(lambda s: not s.lower().startswith("sentence")),
    min_size=1,
    max_size=6,
    unique_by=str.lower,
)


@given(sentences=_FIELD_TEXT, data=st.data())
def test_well_formed_replies_parse_exactly_under_decoration(sentences: list[str], data: st.DataObject) -> None:
    """Whatever markdown, case and brackets a judge adds, the verdict and typing survive."""
    kinds = data.draw(st.lists(st.sampled_from([P, R]), min_size=len(sentences), max_size=len(sentences)))
    first = data.draw(st.one_of(st.none(), st.integers(0, len(sentences) - 1)))
    bold = data.draw(st.booleans())
    brackets = data.draw(st.booleans())
    upper = data.draw(st.booleans())
    by_number = data.draw(st.booleans())

    def label(name: str) -> str:
        name = f"[{name}]:" if brackets else f"{name}:"
        return f"**{name}**" if bold else name

    def case(word: str) -> str:
        return word.upper() if upper else word.lower()

    lines = [f"{label('Image description')} something"]
    lines += [f"Sentence {i + 1}: {case(kind.name)}" for i, kind in enumerate(kinds)]
    lines.append(f"{label('Faithfulness')} {case('UNFAITHFUL' if first is not None else 'FAITHFUL')}")
    named = "" if first is None else (f"Sentence {first + 1}" if by_number else f'"{sentences[first]}"')
    lines.append(f"{label('First unfaithful sentence')} {named}")
    reply = parse_judge_reply("\n".join(lines), sentences)
    assert reply.kinds == dict(enumerate(kinds))
    assert reply.first_unfaithful == first
