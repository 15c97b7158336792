"""Reasoning formats: the model's own text rebuilt from what vLLM's parser split, the partial message a
continuation sends, and the markers that bound steps (the segmenter with a format's tags)."""

from __future__ import annotations

import pytest

from faithproxy.faithcore.reasoning_formats import FORMATS, get_format
from faithproxy.faithcore.segmenter import StepSegmenter, segment_text
from faithproxy.faithcore.types import Channel

R, C = Channel.REASONING, Channel.CONTENT


def accepted(reasoning: str = "", content: str = "") -> dict[Channel, str]:
    return {R: reasoning, C: content}


def test_think_puts_back_the_markers_the_parser_dropped() -> None:
    fmt = get_format("think")
    cont = fmt.continuation(accepted("\nI see a car.", ""))
    assert (cont.content, cont.in_answer, dict(cont.bridge)) == ("<think>\nI see a car.", False, {})
    cont = fmt.continuation(accepted("\nI see a car.\n", "\n\nIt is red."))
    assert cont.content == "<think>\nI see a car.\n</think>\n\nIt is red." and cont.in_answer
    # unparsed: the markers are in the text already
    cont = fmt.continuation(accepted("", "<think>\nI see a car."))
    assert (cont.content, cont.in_answer) == ("<think>\nI see a car.", False)
    assert fmt.continuation(accepted("", "<think>\nA car.\n</think>\n\nRed.")).in_answer


def test_a_model_that_did_not_think_is_answering() -> None:
    assert get_format("think").continuation(accepted("", "The car is red.")).in_answer
    assert get_format("plain").continuation(accepted("", "<think> is just text")).in_answer


def test_glm_answer_block() -> None:
    fmt = get_format("think_answer")
    assert fmt.tags == ("<think>", "</think>", "<answer>", "</answer>")
    cont = fmt.continuation(accepted("A car.", "<answer>It is red."))
    assert cont.content == "<think>A car.</think><answer>It is red." and cont.in_answer
    cont = fmt.continuation(accepted("A car. It is red.", ""))
    assert cont.content == "<think>A car. It is red." and not cont.in_answer


def test_qwen3_closes_a_think_block_its_template_cannot_leave_open() -> None:
    fmt = get_format("qwen3")
    # parsed: the bridge is split around the marker, as vLLM's parser would split it
    cont = fmt.continuation(accepted("I see a car.", ""))
    assert cont.content == "I see a car.\n</think>\n\n" and cont.in_answer
    assert dict(cont.bridge) == {R: "\n", C: "\n\n"}
    # unparsed: the prompt opened the block, the model's text has only the close marker
    cont = fmt.continuation(accepted("", "I see a car."))
    assert cont.content == "I see a car.\n</think>\n\n" and dict(cont.bridge) == {C: "\n</think>\n\n"}
    # the model's own newline after its last step was kept (a round stopped there had read it): the
    # bridge does not add a second one, in either channel layout
    cont = fmt.continuation(accepted("I see a car.\n", ""))
    assert cont.content == "I see a car.\n</think>\n\n" and dict(cont.bridge) == {C: "\n\n"}
    cont = fmt.continuation(accepted("", "I see a car.\n"))
    assert cont.content == "I see a car.\n</think>\n\n" and dict(cont.bridge) == {C: "</think>\n\n"}
    # after the block closed, the template renders the text as the model wrote it: nothing to add
    cont = fmt.continuation(accepted("I see a car.\n", "\n\nIt is red."))
    assert cont.content == "I see a car.\n</think>\n\nIt is red." and cont.in_answer and not cont.bridge


def test_think_prompt_restores_the_opening_the_generation_prompt_wrote() -> None:
    fmt = get_format("think_prompt")
    cont = fmt.continuation(accepted("I see a car.", ""))
    assert (cont.content, cont.in_answer, dict(cont.bridge)) == ("<think>\nI see a car.", False, {})
    cont = fmt.continuation(accepted("", "I see a car.\n</think>\n\nRed."))
    assert cont.content == "<think>\nI see a car.\n</think>\n\nRed." and cont.in_answer


def test_other_think_markers() -> None:
    fmt = get_format("think", "◁think▷", "◁/think▷")
    assert fmt.continuation(accepted("A car.", "Red.")).content == "◁think▷A car.◁/think▷Red."
    assert fmt.tags == ("◁think▷", "◁/think▷")


def test_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="think_answer"):
        get_format("glm")
    assert set(FORMATS) == {"think", "plain", "think_answer", "qwen3", "think_prompt"}


GLM = "<think>The image shows one circle. It is red.</think><answer>The circle is red. The answer is A.</answer>"


def test_answer_tags_bound_steps_and_never_enter_their_text() -> None:
    tags = get_format("think_answer").tags
    segments = segment_text(GLM, tags=tags)
    assert [s.text for s in segments] == [
        "The image shows one circle.",
        "It is red.",
        "The circle is red.",
        "The answer is A.",
        "",
    ]
    assert "".join(s.raw for s in segments) == GLM
    assert segments[2].raw == "</think><answer>The circle is red." and segments[-1].raw == "</answer>"
    # without the format's tags the markers would be part of a step
    assert "<answer>The circle is red." in [s.text for s in segment_text(GLM)]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_chunking_never_splits_a_longer_tag(size: int) -> None:
    tags = get_format("think_answer").tags
    segmenter = StepSegmenter(tags=tags)
    out = []
    for i in range(0, len(GLM), size):
        out += segmenter.feed(GLM[i : i + size])
    out += segmenter.flush()
    assert [(s.text, s.raw) for s in out] == [(s.text, s.raw) for s in segment_text(GLM, tags=tags)]
