import random
import re

import pytest

from faithproxy.benchmarks.shapesworld.chains import (
    BY_OBJECT,
    BY_OPTION,
    Chain,
    hallucinated_chain,
    perception_sentences,
    reference_chain,
)
from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, REASONING, check_chain
from faithproxy.benchmarks.shapesworld.language import parse_claim
from faithproxy.benchmarks.shapesworld.perturb import OBJECT_KINDS
from faithproxy.benchmarks.shapesworld.questions import LETTERS, QTYPES, make_question

_SHAPE = re.compile(r"\A<think>\n(?P<inner>.+)\n</think>\n\nThe answer is (?P<letter>[ABCD])\.\Z", re.DOTALL)


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=\.) ", text)


def _assert_well_formed(chain: Chain) -> re.Match[str]:
    match = _SHAPE.match(chain.text())
    assert match is not None, chain.text()
    assert match.group("letter") == chain.answer
    assert _sentences(match.group("inner")) == chain.sentences
    return match


@pytest.mark.parametrize("qtype", QTYPES)
def test_reference_chains_are_well_formed_and_reach_the_gold_letter(qtype, fixed_scenes):
    for i, scene in enumerate(fixed_scenes):
        question = make_question(scene, random.Random(i), qtype)
        chain = reference_chain(scene, question)
        _assert_well_formed(chain)
        assert chain.answer == question.gold_letter
        assert chain.sentences[-1] == f"So the answer is {question.gold_text} {question.gold_letter}."
        assert chain.sentences[: len(scene.objects) + 1] == perception_sentences(scene.objects)
        kinds = [s.kind for s in chain.steps]
        assert kinds == [PERCEPTION] * (len(scene.objects) + 1) + [REASONING] * (len(kinds) - len(scene.objects) - 1)
        assert all(s.faithful is (True if s.kind == PERCEPTION else None) for s in chain.steps)


def test_hallucinated_chains_carry_one_labelled_error(fixed_scenes):
    kinds, changed_answers, total = set(), 0, 0
    for i, scene in enumerate(fixed_scenes):
        rng = random.Random(i)
        question = make_question(scene, rng, QTYPES[i % len(QTYPES)])
        hallucination = hallucinated_chain(scene, question, rng)
        if hallucination is None:
            continue
        total += 1
        chain = hallucination.chain
        _assert_well_formed(chain)
        k = chain.first_unfaithful
        assert k is not None and chain.steps[k].kind == PERCEPTION
        assert all(s.faithful is not False for s in chain.steps[:k])
        # the labels are what the checker says against the truth, and the correction is true
        assert check_chain(chain.sentences, scene.objects).first_unfaithful == k
        assert check_chain([hallucination.correction], scene.objects).faithful
        assert parse_claim(hallucination.correction) is not None and hallucination.correction != chain.sentences[k]
        assert chain.answer in LETTERS
        kinds.add(hallucination.perturbation.kind)
        changed_answers += chain.answer != question.gold_letter
    assert total >= 0.9 * len(fixed_scenes)
    assert kinds == set(OBJECT_KINDS)
    assert changed_answers > 0  # some errors reach the answer, as real hallucinations do


def test_hallucination_is_reproducible(fixed_scenes):
    scene = fixed_scenes[0]
    question = make_question(scene, random.Random(0), "count")
    a = hallucinated_chain(scene, question, random.Random(5))
    b = hallucinated_chain(scene, question, random.Random(5))
    assert a == b


def _existence_steps(qtype, fixed_scenes, style):
    """For each scene's question of `qtype` with chains in `style`: checks that the style changes
    nothing but an existence chain's reasoning before its answer step, and that the proxy would never
    send that reasoning to a detector; yields (scene, question, those sentences) for existence."""
    from faithproxy.faithcore.kinds import classify_step
    from faithproxy.faithcore.types import StepKind

    for i, scene in enumerate(fixed_scenes):
        question = make_question(scene, random.Random(i), qtype)
        plain, styled = reference_chain(scene, question), reference_chain(scene, question, existence=style)
        _assert_well_formed(styled)
        assert styled.answer == plain.answer == question.gold_letter
        if qtype != "existence":
            assert styled == plain
            continue
        n = len(scene.objects) + 1
        assert styled.sentences[:n] == plain.sentences[:n] and styled.sentences[-1] == plain.sentences[-1]
        assert all(s.kind == REASONING for s in styled.steps[n:])
        assert all(classify_step(s) is StepKind.REASONING for s in styled.sentences[n:])
        yield scene, question, styled.sentences[n:-1]


@pytest.mark.parametrize("qtype", QTYPES)
def test_spelled_out_chains_reason_existence_option_by_option_and_change_nothing_else(qtype, fixed_scenes):
    from faithproxy.benchmarks.shapesworld.world import count_matching

    for scene, question, by_option in _existence_steps(qtype, fixed_scenes, BY_OPTION):
        assert len(by_option) == 4
        options = zip(by_option, question.options, LETTERS, question.spec.candidates, strict=True)
        for sentence, option, letter, ref in options:
            present = count_matching(ref, scene.objects) > 0
            assert sentence == f"So {option} {letter} is {'' if present else 'not '}in the image."


@pytest.mark.parametrize("qtype", QTYPES)
def test_by_object_chains_say_which_option_each_seen_kind_is_and_change_nothing_else(qtype, fixed_scenes):
    for scene, question, said in _existence_steps(qtype, fixed_scenes, BY_OBJECT):
        # one sentence per (colour, shape) seen, in the order the perception sentences first name it
        seen = [f"{o.colour} {o.shape}" for o in sorted(scene.objects, key=lambda o: o.cell)]
        kinds = list(dict.fromkeys(seen))
        assert len(said) == len(kinds)
        for sentence, kind in zip(said, kinds, strict=True):
            if kind in question.options:
                assert sentence == f"So {kind} {LETTERS[question.options.index(kind)]} is an option."
            else:
                assert sentence == f"So {kind} is not an option."
        options_seen = sum(s.endswith(" is an option.") for s in said)
        assert options_seen == (3 if question.spec.negated else 1)  # the gold, or the three distractors


def test_an_unknown_existence_style_is_refused(fixed_scenes):
    scene = fixed_scenes[0]
    question = make_question(scene, random.Random(0), "existence")
    with pytest.raises(ValueError, match="existence must be one of"):
        reference_chain(scene, question, existence="by-letter")
