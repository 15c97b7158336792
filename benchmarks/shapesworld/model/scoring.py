"""The held-out set, and how a reply is scored against ground truth.

A reply is cut into steps with the proxy's own segmenter (`faithcore.segmenter`), and every step is
checked with `shapesworld.claims` against the scene's true objects: perception steps that are false
are the model's perception errors. The judge's view (the same checks against the objects the pixel
parser reads from the image) is recorded next to it, as a cross-check. Steps that are neither
reasoning nor a sentence of the world language are counted as `unparsed`; they are not perception
steps (the proxy could not check them either), so the error rate does not include them, and a
checkpoint that writes many of them is visibly malformed in the summary instead.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_chain, check_chain_image, check_sentence
from faithproxy.benchmarks.shapesworld.dataset import JOINED_EXISTENCE, Item, generate_items
from faithproxy.benchmarks.shapesworld.language import CountClaim, ObjectClaim, is_reasoning
from faithproxy.benchmarks.shapesworld.model.corpus import HELDOUT_SEED
from faithproxy.benchmarks.shapesworld.questions import QTYPES
from faithproxy.benchmarks.shapesworld.scenes import render
from faithproxy.detectors.self_check_prompt import parse_self_check
from faithproxy.faithcore.segmenter import segment_text
from faithproxy.regenerators.prompts import parse_bracketed

_ANSWER = re.compile(r"The answer is ([A-D])\.")
_OPTION = re.compile(r"So the answer is (.+?) ([A-D])\.(?:\s|$)")
_WELL_FORMED = re.compile(r"<think>\n[^\n]+\n</think>\n\nThe answer is [A-D]\.", re.DOTALL)


def heldout_items(
    count: int, seed: int = HELDOUT_SEED, *, joined: bool = JOINED_EXISTENCE, start: int = 0
) -> list[Item]:
    """Held-out scenes and questions (items `start` on); question types cycle, so `count` = 5k (and
    `start` a multiple of 5) gives k of each."""
    return list(generate_items(seed, count, joined=joined, start=start))


@dataclass(frozen=True)
class ReplyScore:
    item_id: str
    qtype: str
    reply: str
    perception_steps: int
    perception_errors: int
    judge_errors: int  # the same steps checked against the parsed image
    unparsed: int
    error_kinds: tuple[str, ...]
    answer: str | None
    correct: bool
    well_formed: bool
    # Where a wrong answer comes from: the option text the chain settles on ("So the answer is Y X.": Y
    # is the gold option's text), and whether its letter X is the letter of the option saying Y.
    option_text_correct: bool = False
    letter_matches_text: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def reply_sentences(reply: str) -> list[str]:
    return [s.text for s in segment_text(reply) if s.text]


def score_reply(item: Item, reply: str) -> ReplyScore:
    sentences = reply_sentences(reply)
    truth = check_chain(sentences, item.scene.objects).sentences
    judge = check_chain_image(render(item.scene), sentences).sentences
    perception = [c for c in truth if c.kind == PERCEPTION]
    wrong = [c for c in perception if c.faithful is False]
    answers = _ANSWER.findall(reply)
    answer = answers[-1] if answers else None
    said = _OPTION.findall(reply)
    text, letter = said[-1] if said else (None, None)
    options = dict(zip("ABCD", item.question.options, strict=False))
    return ReplyScore(
        item_id=item.id,
        qtype=item.question.qtype,
        reply=reply,
        perception_steps=len(perception),
        perception_errors=len(wrong),
        judge_errors=sum(c.faithful is False for c in judge),
        unparsed=sum(c.claim is None and not is_reasoning(c.text) for c in truth),
        error_kinds=tuple(_error_kind(c.claim, item) for c in wrong),
        answer=answer,
        correct=answer == item.question.gold_letter,
        well_formed=_WELL_FORMED.fullmatch(reply.strip()) is not None,
        option_text_correct=text == item.question.gold_text,
        letter_matches_text=letter is not None and options.get(letter) == text,
    )


def _error_kind(claim: Any, item: Item) -> str:
    """What a false claim got wrong: the count, an attribute of the object in its cell, or more."""
    if isinstance(claim, CountClaim):
        return "count"
    if isinstance(claim, ObjectClaim) and claim.ref.row is not None and claim.ref.col is not None:
        there = [o for o in item.scene.objects if o.cell == (claim.ref.row, claim.ref.col)]
        if not there:
            return "no_object_there"
        wrong = [a for a in ("shape", "colour", "size") if getattr(claim.ref, a) not in (None, getattr(there[0], a))]
        return "+".join(wrong) or "other"
    return "other"


@dataclass
class Summary:
    scores: list[ReplyScore] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        scores = self.scores
        steps = sum(s.perception_steps for s in scores)
        by_type = {q: [s for s in scores if s.qtype == q] for q in QTYPES if any(s.qtype == q for s in scores)}
        accuracy = {q: round(sum(s.correct for s in group) / len(group), 4) for q, group in by_type.items()}
        kinds = Counter(k for s in scores for k in s.error_kinds)
        return {
            "n_chains": len(scores),
            "perception_steps": steps,
            "perception_errors": sum(s.perception_errors for s in scores),
            "perception_error_rate": _ratio(sum(s.perception_errors for s in scores), steps),
            "judge_error_rate": _ratio(sum(s.judge_errors for s in scores), steps),
            "chains_with_error": _ratio(sum(s.perception_errors > 0 for s in scores), len(scores)),
            "unparsed_steps": sum(s.unparsed for s in scores),
            "well_formed": _ratio(sum(s.well_formed for s in scores), len(scores)),
            "accuracy": _ratio(sum(s.correct for s in scores), len(scores)),
            "accuracy_by_type": accuracy,
            "min_accuracy": min(accuracy.values()) if accuracy else 0.0,
            "option_text_correct": _ratio(sum(s.option_text_correct for s in scores), len(scores)),
            "letter_matches_text": _ratio(sum(s.letter_matches_text for s in scores), len(scores)),
            "error_kinds": dict(kinds.most_common()),
        }


def summarise(items: Sequence[Item], replies: Iterable[str]) -> Summary:
    return Summary([score_reply(item, reply) for item, reply in zip(items, replies, strict=True)])


def regeneration_ok(scene: Any, reply: str) -> bool:
    """The reply's bracketed sentence is a true perception sentence about the scene."""
    sentence = parse_bracketed(reply)
    return sentence is not None and check_sentence(sentence, scene.objects).faithful is True


def self_check_ok(target: str, reply: str) -> bool:
    """The reply's verdict is the target's (FAITHFUL / UNFAITHFUL)."""
    return parse_self_check(reply) == (target == "FAITHFUL")


def _ratio(a: int, b: int) -> float:
    return round(a / b, 4) if b else 0.0
