"""Reference and hallucinated reasoning chains, in the world language, with per-step labels.

A chain reads like a reasoning VLM's: perception first (the number of objects, then one sentence per
object in reading order), then reasoning that ends by mapping the conclusion to a letter:

    <think>
    There are 2 objects in the image. There is a large red circle in the top left. There is a small
    blue square in the centre. So the square is blue. So the answer is blue C.
    </think>

    The answer is C.

Existence questions have three ways of reasoning (`existence=`; the other types have one):
- ONE_STEP, the default: all four options judged in one sentence ("So of the options only the red
  triangle is in the image."). The model learned it least: its answers were 23-37% right, and of 100
  held-out chains 49 named the right option but only 25 gave the letter of the option they named,
  since every distractor shares a word with the gold, so the lookup must match two words, not one.
- BY_OPTION (`train.py --spell-out-from`): option by option with its letter ("So green triangle A is
  not in the image. ..."). Tried and dropped: after 1,150 steps (from step 13457) the model still
  wrote the wrong option's text for most letters (writing option B's text means finding the prompt's
  letter A and copying what follows it, two hops), and its perception error rate fell to 2%; see README.
- BY_OBJECT (`train.py --by-object-from`): one sentence for each kind of object the perception named,
  in reading order, saying which option it is ("So red triangle C is an option." or "So blue square
  is not an option."). Each is the two-word lookup of the answer step, made once per object, so a
  chain practises it up to four times; the answer is then the one object that is an option (or, for
  "not in the image", the option no object is). Tried and dropped too (runs 11-12 in the README):
  in 2,355 steps from step 14453 the model came to name the right option's text more often (49% ->
  60-67% of 100 held-out existence chains) but not its letter: the letters of its object sentences
  stayed at 45-52% even teacher-forced, and its answer step learned to copy the letter from them,
  so existence answers stayed at 27-35%.

Existence options can also be written as one word each ("red-square", `questions.join_existence`),
which every style above then uses as it is; the committed model reads them as one token each, which
turns the two-word lookup into the one-word lookup of the other types (see README, run 13).

The "So the answer is blue C." step is there on purpose: the prompt lists each option as its text
followed by its letter ("blue C"), so this step turns finding the letter into copying it (see
`Question.prompt`); a tiny model trained without such a step fails to learn the letter mapping.
A chain is computed from a *belief* (a list of objects), so the same code gives the
reference chain (belief = truth) and hallucinated chains (belief = a perturbed truth, whose error then
flows into the reasoning and possibly the answer). Steps are labelled against the truth.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, REASONING, check_chain
from faithproxy.benchmarks.shapesworld.language import CountClaim, ObjectClaim, parse_claim, render_claim
from faithproxy.benchmarks.shapesworld.perturb import OBJECT_KINDS, Perturbation, perturb_objects
from faithproxy.benchmarks.shapesworld.questions import (
    LETTERS,
    AttributeSpec,
    CountSpec,
    ExistenceSpec,
    LocationSpec,
    MoreSpec,
    MostSpec,
    Question,
    RelationSpec,
    related_objects,
    solve,
)
from faithproxy.benchmarks.shapesworld.scenes import Scene
from faithproxy.benchmarks.shapesworld.world import PLURALS, Ref, WorldObject, count_matching

SEPARATOR = " "  # between sentences inside <think>
ONE_STEP, BY_OPTION, BY_OBJECT = "one-step", "by-option", "by-object"
EXISTENCE_STYLES = (ONE_STEP, BY_OPTION, BY_OBJECT)


@dataclass(frozen=True)
class ChainStep:
    """One sentence with its ground-truth labels; `faithful` is None for reasoning steps."""

    text: str
    kind: str  # "perception" | "reasoning"
    faithful: bool | None


@dataclass(frozen=True)
class Chain:
    steps: tuple[ChainStep, ...]
    answer: str  # the letter the chain concludes with

    @property
    def sentences(self) -> list[str]:
        return [s.text for s in self.steps]

    @property
    def first_unfaithful(self) -> int | None:
        return next((i for i, s in enumerate(self.steps) if s.faithful is False), None)

    def text(self) -> str:
        return f"<think>\n{SEPARATOR.join(self.sentences)}\n</think>\n\nThe answer is {self.answer}."


def perception_sentences(objects: Sequence[WorldObject]) -> list[str]:
    sentences = [render_claim(CountClaim(len(objects), Ref()))]
    sentences += [render_claim(ObjectClaim(Ref.of(o))) for o in sorted(objects, key=lambda o: o.cell)]
    return sentences


def reasoning_sentences(
    question: Question, objects: Sequence[WorldObject], *, existence: str = ONE_STEP
) -> list[str] | None:
    """The conclusion drawn from `objects` and its option; None if it matches no option."""
    answer = solve(question.spec, objects)
    letter = None if answer is None else question.letter_of(answer)
    if answer is None or letter is None:
        return None
    return [*_conclusion(question, objects, answer, existence), f"So the answer is {answer} {letter}."]


def _conclusion(question: Question, objects: Sequence[WorldObject], answer: str, existence: str) -> list[str]:
    if existence not in EXISTENCE_STYLES:
        raise ValueError(f"existence must be one of {EXISTENCE_STYLES}, got {existence!r}")
    spec = question.spec
    if isinstance(spec, ExistenceSpec) and existence == BY_OPTION:
        return [
            f"So {spec.option_text(ref)} {letter} is {'' if count_matching(ref, objects) else 'not '}in the image."
            for ref, letter in zip(spec.candidates, LETTERS, strict=True)
        ]
    if isinstance(spec, ExistenceSpec) and existence == BY_OBJECT:
        return [_which_option(kind, question, spec) for kind in _kinds_in_reading_order(objects)]
    if isinstance(spec, CountSpec):
        sentence = render_claim(CountClaim(int(answer), spec.target))
        return ["So " + sentence[0].lower() + sentence[1:]]
    if isinstance(spec, AttributeSpec):
        value = answer if spec.attribute == "colour" else _article(answer)
        return [f"So the {spec.target.noun_phrase()} is {value}."]
    if isinstance(spec, LocationSpec):
        return [f"So the {spec.target.noun_phrase()} is in the {answer}."]
    if isinstance(spec, ExistenceSpec):
        where = "not in the image" if spec.negated else "in the image"
        return [f"So of the options only the {answer} is {where}."]
    if isinstance(spec, RelationSpec):
        related = related_objects(spec, objects)
        assert related is not None and len(related) == 1
        subject = Ref(shape=related[0].shape, colour=related[0].colour, size=related[0].size)
        anchor = spec.anchor.noun_phrase()
        return [f"So the only object {spec.relation} the {anchor} is the {subject.noun_phrase()}."]
    if isinstance(spec, MostSpec):
        count = Counter(getattr(o, spec.attribute) for o in objects)[answer]
        noun = "object" if count == 1 else "objects"
        return [f"So the most common {spec.attribute} is {answer}, with {count} {noun}."]
    assert isinstance(spec, MoreSpec)
    return [f"So I count {_number(spec.a, objects)} and {_number(spec.b, objects)}."]


def _kinds_in_reading_order(objects: Sequence[WorldObject]) -> list[Ref]:
    """Each (colour, shape) the perception sentences name, once, in the order they first name it."""
    kinds: dict[tuple[str | None, str | None], Ref] = {}
    for o in sorted(objects, key=lambda o: o.cell):
        kinds.setdefault((o.colour, o.shape), Ref(colour=o.colour, shape=o.shape))
    return list(kinds.values())


def _which_option(kind: Ref, question: Question, spec: ExistenceSpec) -> str:
    # The letter follows the object's words directly, as it does in the prompt's option line, so
    # that it is the token an induction head copies ("is option C" put two tokens between them, and
    # after 1,460 steps the model wrote one letter for every object).
    name = spec.option_text(kind)  # as the options write it
    letter = question.letter_of(name)
    return f"So {name} {'is not an option' if letter is None else f'{letter} is an option'}."


def _article(shape: str) -> str:
    return ("an " if shape[0] in "aeiou" else "a ") + shape


def _number(shape: str, objects: Sequence[WorldObject]) -> str:
    n = count_matching(Ref(shape=shape), objects)
    return f"no {PLURALS[shape]}" if n == 0 else f"1 {shape}" if n == 1 else f"{n} {PLURALS[shape]}"


def chain_from_belief(
    question: Question, believed: Sequence[WorldObject], truth: Sequence[WorldObject], *, existence: str = ONE_STEP
) -> Chain | None:
    """The chain a model holding `believed` would write, labelled against `truth`."""
    reasoning = reasoning_sentences(question, believed, existence=existence)
    if reasoning is None:
        return None
    perception = perception_sentences(believed)
    checks = check_chain(perception + reasoning, truth).sentences
    steps = tuple(ChainStep(c.text, c.kind, c.faithful) for c in checks)
    # the generator and the checker share one grammar: a mismatch here is a bug in language.py
    assert [s.kind for s in steps] == [PERCEPTION] * len(perception) + [REASONING] * len(reasoning)
    letter = question.letter_of(solve(question.spec, believed) or "")
    assert letter is not None
    return Chain(steps=steps, answer=letter)


def reference_chain(scene: Scene, question: Question, *, existence: str = ONE_STEP) -> Chain:
    chain = chain_from_belief(question, scene.objects, scene.objects, existence=existence)
    assert chain is not None and chain.answer == question.gold_letter
    return chain


@dataclass(frozen=True)
class Hallucination:
    """A chain with one perception error, and the true sentence that should replace its first
    unfaithful step (the target of a regeneration example)."""

    chain: Chain
    perturbation: Perturbation
    correction: str


def hallucinated_chain(
    scene: Scene, question: Question, rng: random.Random, kinds: Sequence[str] = OBJECT_KINDS, tries: int = 8
) -> Hallucination | None:
    """A chain built on a perturbed belief; None if no perturbation gave an answer among the options."""
    truth = [o.describe() for o in scene.objects]
    for _ in range(tries):
        perturbation = perturb_objects(truth, rng, rng.choice(list(kinds)))
        if perturbation is None:
            continue
        chain = chain_from_belief(question, perturbation.believed, truth)
        if chain is None or chain.first_unfaithful is None:
            continue
        bad = parse_claim(chain.steps[chain.first_unfaithful].text)
        if isinstance(bad, CountClaim):
            correction = render_claim(CountClaim(count_matching(bad.ref, truth), bad.ref))
        else:
            assert perturbation.original is not None
            correction = render_claim(ObjectClaim(Ref.of(perturbation.original)))
        return Hallucination(chain, perturbation, correction)
    return None
