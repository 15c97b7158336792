"""The judge prompt reads back exactly, and the reply parser copes with what judges really write."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.clients.judge_base import TextBlock
from faithproxy.detectors.judge_prompt import (
    JUDGE_SYSTEM_PROMPT,
    JudgeReply,
    build_judge_prompt,
    build_judge_turn,
    chain_cuts,
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


def test_system_prompt_has_the_table_15_structure() -> None:
    """Grounding first, typing, the 'matters for the question' rule, the first unfaithful sentence only;
    the prefix field of Table 15 is gone (the number of the first unfaithful sentence says it)."""
    for needle in (
        "describe it briefly, before anything else",
        "PERCEPTION",
        "REASONING",
        "matters for answering the question",
        "FIRST unfaithful",
        "[Image description]:",
        "[Faithfulness]: FAITHFUL or UNFAITHFUL",
        "[First unfaithful sentence]: <its number>",
        "never report them",
    ):
        assert needle in JUDGE_SYSTEM_PROMPT
    assert "[Faithful reasoning chain prefix]" not in JUDGE_SYSTEM_PROMPT


def test_prompt_lays_out_question_chain_and_the_sentences_to_check() -> None:
    prompt = build_judge_prompt("What does the man wear?", CHAIN, ask_description=True)
    assert prompt.startswith("Question:\nWhat does the man wear?\n")
    assert "Sentence 1: The image shows a man standing next to a bicycle." in prompt
    assert "Sentence 4: So the man is probably going shopping." in prompt
    assert prompt.endswith("\nCheck sentences 1 to 4. Begin with [Image description].\n")
    later = build_judge_prompt("q", CHAIN, already_checked=3, description="A man.")
    assert later.endswith("\nCheck sentence 4. Sentences 1 to 3 are context only.\n")
    assert "A man." in later and "Begin with" not in later
    # the instructions are in the system prompt, not repeated in every user turn
    assert "Instructions" not in prompt and "Reply in exactly" not in prompt


def test_prompt_reads_back() -> None:
    question = "Look closely.\n\nWhich option (A or B) is right?"
    sentences = ["First\nline  with   gaps.", "Sentence 2: quoted inside.", ""]
    prompt = build_judge_prompt(question, sentences, already_checked=2, description="A red\ncar.")
    parsed = parse_judge_prompt_details(prompt)
    assert parsed.question == question
    assert parsed.sentences == ["First line with gaps.", "Sentence 2: quoted inside.", ""]
    assert parsed.already_checked == 2
    assert parsed.description == "A red car."
    assert parsed.asks_description is False
    assert parse_judge_prompt(prompt) == (question, parsed.sentences)
    asking = parse_judge_prompt_details(build_judge_prompt(question, sentences, ask_description=True))
    assert asking.asks_description is True and asking.description is None
    # a description given is never asked for again
    assert not parse_judge_prompt_details(
        build_judge_prompt(question, sentences, description="A car.", ask_description=True)
    ).asks_description


@given(
    question=st.text(min_size=1).filter(
        lambda q: q.strip() and "Reasoning chain so far" not in q and "Your description of the image" not in q
    ),
    sentences=st.lists(st.text(), min_size=1, max_size=6),
    description=st.one_of(st.none(), st.text().filter(lambda d: d.strip())),
    data=st.data(),
)
def test_prompt_round_trip_property(
    question: str, sentences: list[str], description: str | None, data: st.DataObject
) -> None:
    checked = data.draw(st.integers(0, len(sentences) - 1))
    splits = data.draw(st.sets(st.integers(-2, len(sentences) + 2)))
    prompt = build_judge_prompt(question, sentences, already_checked=checked, description=description, splits=splits)
    parsed = parse_judge_prompt_details(prompt)
    assert parsed.question == question.strip()
    assert parsed.sentences == [" ".join(s.split()) for s in sentences]
    assert parsed.already_checked == checked
    assert parsed.description == (" ".join(description.split()) if description else None)


@pytest.mark.parametrize("text", ["", "hello", "Question:\nwhat?\n\nno chain here", "Question:\nq\n"])
def test_parse_prompt_rejects_other_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse_judge_prompt(text)


def test_build_prompt_rejects_bad_checked_count() -> None:
    with pytest.raises(ValueError):
        build_judge_prompt("q", ["a"], already_checked=2)
    with pytest.raises(ValueError):  # nothing left to check is not a call worth making
        build_judge_prompt("q", ["a"], already_checked=1)


def test_blocks_are_cut_where_earlier_calls_cut_them() -> None:
    blocks = build_judge_turn("q", ["a", "b", "c", "d", "e"], already_checked=3, description="D.", splits={1, 9})
    texts = [b.text for b in blocks]
    assert texts[0] == "Question:\nq\n\n" and blocks[0].cache  # shared by every call of a request
    assert texts[1].endswith("D.\n\n") and not blocks[1].cache
    assert texts[2].endswith("Sentence 1: a\n") and not blocks[2].cache  # an earlier call's cut
    assert texts[3] == "Sentence 2: b\nSentence 3: c\n" and blocks[3].cache  # the end of the accepted part
    assert texts[4] == "Sentence 4: d\nSentence 5: e\n" and blocks[4].cache  # the end of the chain
    assert texts[5].startswith("\nCheck sentences 4 to 5.") and not blocks[5].cache
    assert chain_cuts(5, 3, {1, 9}) == [1, 3, 5]


@given(
    batches=st.lists(st.integers(1, 4), min_size=2, max_size=12),
    flagged=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_each_call_repeats_the_previous_call_block_for_block(batches: list[int], flagged: list[bool]) -> None:
    """Calls made the way the detector makes them (cuts remembered per request): when a call's new
    sentences were all accepted, the next call starts with every block of that call but its request
    line; when one was rewritten, it still starts with every block before the rewritten sentence."""
    splits: set[int] = set()
    accepted: list[str] = []
    previous: list[TextBlock] | None = None
    rewritten_at: int | None = None  # where the previous call's first new sentence was rewritten
    counter = iter(range(10_000))
    for i, size in enumerate(batches):
        new = [f"sentence {next(counter)} about the image." for _ in range(size)]
        sentences = accepted + new
        blocks = build_judge_turn("q?", sentences, already_checked=len(accepted), description="D.", splits=splits)
        splits.update(chain_cuts(len(sentences), len(accepted), splits))
        if previous is not None:
            stable = [b.text for b in previous[:-1]]
            if rewritten_at is not None:
                stable = [b.text for b in previous[:-1] if _covers(b.text) <= rewritten_at]
            assert [b.text for b in blocks[: len(stable)]] == stable
        rewritten_at = len(accepted) if flagged[i] else None
        if flagged[i]:  # the first new sentence was unfaithful and rewritten; the rest was dropped
            accepted = [*accepted, "a rewritten sentence."]
        else:
            accepted = sentences
        previous = blocks


def _covers(text: str) -> int:
    """The highest sentence number a block holds (0 for blocks before the chain)."""
    numbers = [int(n) for n in re.findall(r"^Sentence (\d+):", text, re.MULTILINE)]
    return max(numbers, default=0)


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
