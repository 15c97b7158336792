"""Multiple-choice question templates (A-D) and their solvers.

Each question keeps a structured `spec` besides its text, so that its answer can be recomputed from
any list of objects: the true scene gives the gold answer, a hallucinated belief gives the answer a
chain built on that belief arrives at (`chains.py`). `solve` returns None when the question has no
single answer for those objects; templates are only instantiated where the true scene has one.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from faithproxy.benchmarks.shapesworld.claims import relation_holds
from faithproxy.benchmarks.shapesworld.language import RELATIONS
from faithproxy.benchmarks.shapesworld.scenes import MAX_OBJECTS, Scene
from faithproxy.benchmarks.shapesworld.world import (
    COLOURS,
    PLURALS,
    POSITIONS,
    SHAPES,
    Ref,
    WorldObject,
    count_matching,
)

QTYPES: tuple[str, ...] = ("count", "attribute", "existence", "spatial", "comparison")
LETTERS = "ABCD"


@dataclass(frozen=True)
class CountSpec:
    target: Ref


@dataclass(frozen=True)
class AttributeSpec:
    target: Ref
    attribute: str  # "colour" | "shape"


@dataclass(frozen=True)
class ExistenceSpec:
    candidates: tuple[Ref, ...]  # in option order
    negated: bool
    joined: bool = False  # options written as one word each ("red-square"; see `join_existence`)

    def option_text(self, ref: Ref) -> str:
        return ref.noun_phrase().replace(" ", "-") if self.joined else ref.noun_phrase()


@dataclass(frozen=True)
class RelationSpec:
    anchor: Ref
    relation: str


@dataclass(frozen=True)
class LocationSpec:
    target: Ref


@dataclass(frozen=True)
class MostSpec:
    attribute: str  # "colour" | "shape"


@dataclass(frozen=True)
class MoreSpec:
    a: str  # shapes
    b: str


Spec = CountSpec | AttributeSpec | ExistenceSpec | RelationSpec | LocationSpec | MostSpec | MoreSpec

MORE_OPTIONS = ("Yes", "No, fewer", "No, the same number", "Neither is in the image")


@dataclass(frozen=True)
class Question:
    qtype: str
    text: str
    options: tuple[str, ...]
    gold_letter: str
    gold_text: str
    spec: Spec

    @property
    def prompt(self) -> str:
        """The question as the model sees it: the text, then one line per option, its text first and
        its letter after it ("- blue A"; the dash keeps the text's first word the same token, space
        included, as where the chain repeats it).

        Text before letter is for the tiny model: its chain ends "So the answer is blue A.", and
        writing the letter is then copying the token that followed "blue" in the prompt (what an
        induction head does). With the usual "A. blue" it had to look backwards from the text it
        had concluded to the letter before it, and a 4-layer model trained on 93k samples never
        learned that: it named the right option text in 63% of chains but that option's letter in
        27%, so its answers stayed at chance.
        """
        lines = [self.text] + [f"- {option} {letter}" for letter, option in zip(LETTERS, self.options, strict=True)]
        return "\n".join(lines)

    def letter_of(self, answer_text: str) -> str | None:
        return LETTERS[self.options.index(answer_text)] if answer_text in self.options else None


class NoQuestionError(ValueError):
    """No template of the asked type has a single answer in this scene."""


def make_question(scene: Scene, rng: random.Random, qtype: str) -> Question:
    """One question of `qtype` about the scene, with options shuffled by `rng`."""
    if qtype not in _BUILDERS:
        raise ValueError(f"unknown question type {qtype!r}; expected one of {QTYPES}")
    objects = [o.describe() for o in scene.objects]
    candidates = _BUILDERS[qtype](objects, rng)
    if not candidates:  # e.g. spatial, when every object has a twin and no relation singles one out
        raise NoQuestionError(f"no {qtype} question has a single answer in scene {scene.seed}/{scene.index}")
    text, spec, distractors = rng.choice(candidates)
    gold = solve(spec, objects)
    if gold is None or gold in distractors or len(set(distractors)) != 3:
        raise AssertionError(f"template built an invalid question: {text!r}")
    options = [gold, *distractors]
    rng.shuffle(options)
    if isinstance(spec, ExistenceSpec):  # the spec lists candidates in option order
        by_text = {ref.noun_phrase(): ref for ref in spec.candidates}
        spec = ExistenceSpec(tuple(by_text[o] for o in options), spec.negated)
    return Question(qtype, text, tuple(options), LETTERS[options.index(gold)], gold, spec)


def join_existence(question: Question) -> Question:
    """An existence question with each option written as one word ("red-square", a token of its own
    in the committed model's tokenizer, `corpus.JOINED_TOKENS`); any other question as it is.

    Every distractor of an existence question shares its colour or its shape with the gold option,
    so finding the letter of "red square" among "red circle", "blue square", ... means matching two
    words, and the 6-layer model learned only to match the last one: of the chains that named the
    right option, about 1/2, 1/3, 1/3 gave its letter when 1, 2, 3 other options ended in the same
    word (`existence_check`). As one token, the option is found by the one-token match the model
    does well on every other type. The question itself (what is and is not in the image) is the same.
    """
    spec = question.spec
    if not isinstance(spec, ExistenceSpec) or spec.joined:
        return question
    spec = ExistenceSpec(spec.candidates, spec.negated, joined=True)
    options = tuple(spec.option_text(ref) for ref in spec.candidates)
    gold = options[LETTERS.index(question.gold_letter)]
    return Question(question.qtype, question.text, options, question.gold_letter, gold, spec)


def solve(spec: Spec, objects: Sequence[WorldObject]) -> str | None:
    """The answer text for these objects, or None when the question has no single answer."""
    if isinstance(spec, CountSpec):
        return str(count_matching(spec.target, objects))
    if isinstance(spec, AttributeSpec | LocationSpec):
        found = [o for o in objects if spec.target.matches(o)]
        if len(found) != 1:
            return None
        if isinstance(spec, LocationSpec):
            return found[0].position
        return found[0].colour if spec.attribute == "colour" else found[0].shape
    if isinstance(spec, ExistenceSpec):
        hits = [r for r in spec.candidates if (count_matching(r, objects) > 0) != spec.negated]
        return spec.option_text(hits[0]) if len(hits) == 1 else None
    if isinstance(spec, RelationSpec):
        related = related_objects(spec, objects)
        return related[0].shape if related is not None and len(related) == 1 else None
    if isinstance(spec, MostSpec):
        counts = Counter(getattr(o, spec.attribute) for o in objects).most_common()
        if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
            return None
        return str(counts[0][0])
    ca, cb = count_matching(Ref(shape=spec.a), objects), count_matching(Ref(shape=spec.b), objects)
    if ca == cb == 0:
        return MORE_OPTIONS[3]
    return MORE_OPTIONS[0] if ca > cb else MORE_OPTIONS[1] if ca < cb else MORE_OPTIONS[2]


def related_objects(spec: RelationSpec, objects: Sequence[WorldObject]) -> list[WorldObject] | None:
    """The objects in `spec.relation` to the anchor; None unless exactly one object is the anchor."""
    anchors = [o for o in objects if spec.anchor.matches(o)]
    if len(anchors) != 1:
        return None
    return [o for o in objects if o is not anchors[0] and relation_holds(spec.relation, o, anchors[0])]


# --- templates -----------------------------------------------------------------------------------
# Each builder returns every (text, spec, 3 distractors) it can instantiate for the objects.

Candidate = tuple[str, Spec, list[str]]


def referring_ref(obj: WorldObject, objects: Sequence[WorldObject], exclude: str) -> Ref | None:
    """The shortest description naming `obj` alone, without the attribute the question asks about.

    `exclude` is "colour", "shape", "position" or "" (nothing); None when no description is left.
    """
    cell = {"row": obj.row, "col": obj.col}
    for fields in (
        {"shape": obj.shape},
        {"colour": obj.colour, "shape": obj.shape},
        {"size": obj.size, "shape": obj.shape},
        {"colour": obj.colour},
        {"size": obj.size, "colour": obj.colour, "shape": obj.shape},
        {"size": obj.size, "colour": obj.colour},
        {"shape": obj.shape} | cell,
        cell,
    ):
        if exclude in fields or (exclude == "position" and "row" in fields):
            continue
        ref = Ref(**fields)  # type: ignore[arg-type]
        if count_matching(ref, objects) == 1:
            return ref
    return None


def _count(objects: Sequence[WorldObject], rng: random.Random) -> list[Candidate]:
    targets = [Ref()] + [Ref(shape=s) for s in SHAPES] + [Ref(colour=o.colour) for o in objects]
    targets += [Ref(colour=o.colour, shape=o.shape) for o in objects]
    out: list[Candidate] = []
    for target in dict.fromkeys(targets):
        gold = count_matching(target, objects)
        others = rng.sample([n for n in range(MAX_OBJECTS + 1) if n != gold], 3)
        out.append(
            (f"How many {target.noun_phrase(plural=True)} are there?", CountSpec(target), [str(n) for n in others])
        )
    return out


def _attribute(objects: Sequence[WorldObject], rng: random.Random) -> list[Candidate]:
    out: list[Candidate] = []
    for obj in objects:
        if (ref := referring_ref(obj, objects, "colour")) is not None:
            others = rng.sample([c for c in COLOURS if c != obj.colour], 3)
            out.append((f"What colour is the {ref.noun_phrase()}?", AttributeSpec(ref, "colour"), others))
        if (ref := referring_ref(obj, objects, "shape")) is not None:
            others = [s for s in SHAPES if s != obj.shape]
            out.append((f"What shape is the {ref.noun_phrase()}?", AttributeSpec(ref, "shape"), others))
    return out


def _existence(objects: Sequence[WorldObject], rng: random.Random) -> list[Candidate]:
    present = sorted({(o.colour, o.shape) for o in objects})
    absent = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in present]
    out: list[Candidate] = []
    for gold, pool, negated in [(p, absent, False) for p in present] + (
        [(a, present, True) for a in rng.sample(absent, 2)] if len(present) >= 3 else []
    ):
        # prefer near misses (same colour or same shape as the gold) as distractors
        near = [x for x in pool if x[0] == gold[0] or x[1] == gold[1]]
        chosen = rng.sample(near, 3) if len(near) >= 3 else rng.sample(pool, 3)
        refs = tuple(Ref(colour=c, shape=s) for c, s in [gold, *chosen])
        text = "Which of these is not in the image?" if negated else "Which of these is in the image?"
        out.append((text, ExistenceSpec(refs, negated), [r.noun_phrase() for r in refs[1:]]))
    return out


def _spatial(objects: Sequence[WorldObject], rng: random.Random) -> list[Candidate]:
    out: list[Candidate] = []
    for obj in objects:
        anchor = referring_ref(obj, objects, exclude="")  # a position may name the anchor
        assert anchor is not None  # the cell alone always names one object
        for relation in RELATIONS:
            spec = RelationSpec(anchor, relation)
            related = related_objects(spec, objects)
            if related is not None and len(related) == 1:
                others = [s for s in SHAPES if s != related[0].shape]
                out.append((f"What shape is {relation} the {anchor.noun_phrase()}?", spec, others))
    if out:
        return out
    for obj in objects:  # no relation has a single answer: ask where an object is
        if (ref := referring_ref(obj, objects, "position")) is not None:
            others = rng.sample([p for p in POSITIONS.values() if p != obj.position], 3)
            out.append((f"Where is the {ref.noun_phrase()}?", LocationSpec(ref), others))
    return out


def _comparison(objects: Sequence[WorldObject], rng: random.Random) -> list[Candidate]:
    out: list[Candidate] = []
    if len(objects) >= 2:
        for attribute, values in (("colour", COLOURS), ("shape", SHAPES)):
            spec = MostSpec(attribute)
            gold = solve(spec, objects)
            if gold is not None:
                others = rng.sample([v for v in values if v != gold], 3)
                out.append((f"Which {attribute} appears most often?", spec, others))
    present = {o.shape for o in objects}
    for a in SHAPES:
        for b in SHAPES:
            if a != b and (a in present or b in present):
                more = MoreSpec(a, b)
                gold = solve(more, objects)
                others = [o for o in MORE_OPTIONS if o != gold]
                out.append((f"Are there more {PLURALS[a]} than {PLURALS[b]}?", more, others))
    return out


_BUILDERS = {
    "count": _count,
    "attribute": _attribute,
    "existence": _existence,
    "spatial": _spatial,
    "comparison": _comparison,
}
