"""The segmenter skips Punkt for deltas that cannot end a step (no sentence-end character, newline or
tag start in its buffer): feed by feed, it emits exactly what it emits without the shortcut."""

from __future__ import annotations

import re

import pytest
from hypothesis import given

from faithproxy.faithcore import segmenter as segmenter_module
from faithproxy.faithcore.segmenter import StepSegmenter
from tests.faithcore.test_segmenter import _PROPERTY, text_and_pieces

EVERYTHING = re.compile(r"[\s\S]")  # every character "may cut": the shortcut never applies


def feeds(pieces: list[str], tags: tuple[str, ...] = ("<think>", "</think>"), *, skip: bool) -> list[list[str]]:
    segmenter = StepSegmenter(tags=tags)
    if not skip:
        segmenter._rules = segmenter_module._TagRules(
            **{**segmenter._rules.__dict__, "may_cut": EVERYTHING}  # type: ignore[arg-type]
        )
    out = [[f"{s.text}|{s.raw}" for s in segmenter.feed(piece)] for piece in pieces]
    return out + [[f"{s.text}|{s.raw}" for s in segmenter.flush()]]


@_PROPERTY
@given(text_and_pieces())
def test_the_shortcut_changes_no_feed(case: tuple[str, list[str]]) -> None:
    _, pieces = case
    assert feeds(pieces, skip=True) == feeds(pieces, skip=False)


@_PROPERTY
@given(text_and_pieces())
def test_the_shortcut_changes_no_feed_with_other_tags(case: tuple[str, list[str]]) -> None:
    _, pieces = case
    tags = ("<think>", "</think>", "<answer>", "</answer>", "[[END]]")
    assert feeds(pieces, tags, skip=True) == feeds(pieces, tags, skip=False)


def test_words_inside_a_sentence_do_not_run_punkt(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = segmenter_module._punkt_ends
    monkeypatch.setattr(segmenter_module, "_punkt_ends", lambda text, closed: calls.append(text) or real(text, closed))
    segmenter = StepSegmenter()
    words = "The red cube sits left of the blue sphere. It is large and shiny. So the answer is B."
    emitted = [s.text for piece in re.findall(r"\S+\s*", words) for s in segmenter.feed(piece)]
    assert emitted == ["The red cube sits left of the blue sphere.", "It is large and shiny."]
    # Punkt runs once per sentence: when the word after its period is complete ("It ", "So ").
    assert calls == ["The red cube sits left of the blue sphere. It ", "It is large and shiny. So "]
