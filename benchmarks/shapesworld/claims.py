"""Check world-language sentences against a list of objects: the parsed image, or the ground truth.

The same checking code runs on both: against `parse_image(...)` it is the judge (it reads pixels);
against `scene.objects` it gives the construction-time labels. The two agree exactly when the parser
recovers every object, which the tests measure.

Every misdescription counts as unfaithful here, whether or not it matters to the question (the paper's
detector ignores minor background errors; in ShapesWorld there is no background to err about).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from faithproxy.benchmarks.shapesworld.language import (
    Claim,
    CountClaim,
    ObjectClaim,
    RelationClaim,
    is_reasoning,
    parse_claim,
)
from faithproxy.benchmarks.shapesworld.parser import ImageInput, parse_image
from faithproxy.benchmarks.shapesworld.world import WorldObject, count_matching
from faithproxy.detectors.claim_readers import ClaimReader

PERCEPTION = "perception"
REASONING = "reasoning"


def check_claim(claim: Claim, objects: Sequence[WorldObject]) -> bool:
    """True when the claim holds for these objects."""
    if isinstance(claim, ObjectClaim):
        return any(claim.ref.matches(o) for o in objects)
    if isinstance(claim, CountClaim):
        return count_matching(claim.ref, objects) == claim.n
    return any(
        relation_holds(claim.relation, s, a)
        for s in objects
        if claim.subject.matches(s)
        for a in objects
        if a is not s and claim.anchor.matches(a)
    )


def relation_holds(relation: str, subject: WorldObject, anchor: WorldObject) -> bool:
    if relation == "to the left of":
        return subject.col < anchor.col
    if relation == "to the right of":
        return subject.col > anchor.col
    if relation == "above":
        return subject.row < anchor.row
    if relation == "below":
        return subject.row > anchor.row
    raise ValueError(f"unknown relation {relation!r}")


@dataclass(frozen=True)
class SentenceCheck:
    """One sentence's verdict. `faithful` is None for reasoning and for sentences the grammar can't
    read (`claim` None): those are not perception claims and are never flagged."""

    text: str
    kind: str  # PERCEPTION | REASONING
    faithful: bool | None
    claim: Claim | None


@dataclass(frozen=True)
class ChainCheck:
    sentences: tuple[SentenceCheck, ...]
    first_unfaithful: int | None  # 0-based index into `sentences`

    @property
    def faithful(self) -> bool:
        return self.first_unfaithful is None

    @property
    def prefix(self) -> list[str]:
        """The sentences before the first unfaithful one (all of them when the chain is faithful)."""
        end = len(self.sentences) if self.first_unfaithful is None else self.first_unfaithful
        return [s.text for s in self.sentences[:end]]


def check_sentence(sentence: str, objects: Sequence[WorldObject]) -> SentenceCheck:
    if is_reasoning(sentence):
        return SentenceCheck(sentence, REASONING, None, None)
    claim = parse_claim(sentence)
    if claim is None:
        return SentenceCheck(sentence, REASONING, None, None)
    return SentenceCheck(sentence, PERCEPTION, check_claim(claim, objects), claim)


def check_chain(sentences: Sequence[str], objects: Sequence[WorldObject]) -> ChainCheck:
    checks = tuple(check_sentence(s, objects) for s in sentences)
    first = next((i for i, c in enumerate(checks) if c.faithful is False), None)
    return ChainCheck(sentences=checks, first_unfaithful=first)


def check_chain_image(image: ImageInput, sentences: Sequence[str]) -> ChainCheck:
    """The judge: check a chain against what the parser sees in the image."""
    return check_chain(sentences, parse_image(image).objects)


class WorldClaims(ClaimReader):
    """The consistency detector's claim reader for ShapesWorld: a sentence's claim in the world's grammar
    (`FAITHPROXY_CONSISTENCY_CLAIMS=faithproxy.benchmarks.shapesworld.claims:WorldClaims`). Two sentences agree
    when they parse to the same claim, however they are spelled ("3" or "three", "colour" or "color")."""

    name = "shapesworld"

    def key(self, sentence: str) -> Claim | None:
        return None if is_reasoning(sentence) else parse_claim(sentence)

    def kind(self, sentence: str) -> str | None:
        claim = self.key(sentence)
        return None if claim is None else step_type(claim)


def step_type(claim: Claim) -> str:
    """The form of a perception sentence: what it asserts about the image (count, absence, relation,
    object_in_cell, object)."""
    if isinstance(claim, CountClaim):
        return "absence" if claim.n == 0 else "count"
    if isinstance(claim, RelationClaim):
        return "relation"
    if claim.ref.row is not None and claim.ref.col is not None:
        return "object_in_cell"
    return "object"
