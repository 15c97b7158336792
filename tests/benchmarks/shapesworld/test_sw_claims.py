import random

from faithproxy.benchmarks.shapesworld.chains import perception_sentences
from faithproxy.benchmarks.shapesworld.claims import (
    PERCEPTION,
    REASONING,
    check_chain,
    check_chain_image,
    check_claim,
    check_sentence,
)
from faithproxy.benchmarks.shapesworld.language import CountClaim, ObjectClaim, RelationClaim, render_claim
from faithproxy.benchmarks.shapesworld.perturb import perturb_claim
from faithproxy.benchmarks.shapesworld.scenes import generate_scene, render
from faithproxy.benchmarks.shapesworld.world import COLOURS, SHAPES, Ref, count_matching


def _true_claims(objects, rng):
    """Claims true of the objects by construction, in every form the grammar has."""
    claims = [CountClaim(len(objects), Ref())] + [ObjectClaim(Ref.of(o)) for o in objects]
    for o in objects:
        claims.append(ObjectClaim(Ref(shape=o.shape, colour=o.colour)))  # "There is a red circle."
        claims.append(ObjectClaim(Ref(shape=o.shape, col=o.col)))  # "There is a circle on the left."
    shape = rng.choice(SHAPES)
    claims.append(CountClaim(sum(o.shape == shape for o in objects), Ref(shape=shape)))
    absent = [(c, s) for c in COLOURS for s in SHAPES if not any(o.colour == c and o.shape == s for o in objects)]
    colour, shape = rng.choice(absent)
    claims.append(CountClaim(0, Ref(shape=shape, colour=colour)))
    for a in objects:
        for b in objects:
            if a.col < b.col:
                claims.append(RelationClaim(Ref.of(a), "to the left of", Ref(shape=b.shape, colour=b.colour)))
            if a.row > b.row:
                claims.append(RelationClaim(Ref(shape=a.shape), "below", Ref.of(b)))
    return claims


def _labelled(scene, rng):
    labelled = []
    for claim in _true_claims(scene.objects, rng):
        assert check_claim(claim, scene.objects)
        labelled.append((render_claim(claim), True))
        wrong = perturb_claim(claim, scene.objects, rng)
        if wrong is not None:
            labelled.append((render_claim(wrong), False))
    return labelled


def test_checker_on_pixels_agrees_with_construction_labels(fixed_scenes, fixed_parsed):
    """Measured at the time of writing: 8,415 / 8,415 sentences agree (4,204 of them perturbed)."""
    rng = random.Random(0)
    total = agree = perturbed = 0
    for scene, parsed in zip(fixed_scenes, fixed_parsed, strict=True):
        for sentence, label in _labelled(scene, rng):
            check = check_sentence(sentence, parsed.objects)
            assert check.kind == PERCEPTION, sentence
            total += 1
            agree += check.faithful is label
            perturbed += not label
    assert total >= 5000 and perturbed >= total // 3
    assert agree / total >= 0.99, f"{agree}/{total}"


def test_perturbations_cover_every_kind_of_error(fixed_scenes):
    rng = random.Random(1)
    changed = set()
    for scene in fixed_scenes[:60]:
        for o in scene.objects:
            claim = ObjectClaim(Ref.of(o))
            wrong = perturb_claim(claim, scene.objects, rng)
            assert wrong is not None and not check_claim(wrong, scene.objects)
            changed |= {f for f in ("shape", "colour", "size", "row", "col") if getattr(wrong.ref, f) != getattr(o, f)}
        count = perturb_claim(CountClaim(len(scene.objects), Ref()), scene.objects, rng)
        assert count is not None and count.n != count_matching(Ref(), scene.objects)
    assert changed == {"shape", "colour", "size", "row", "col"}


def test_chain_check_types_sentences_and_finds_the_first_unfaithful_one():
    scene = generate_scene(3, 4)
    truth = perception_sentences(scene.objects)
    first = scene.objects[0]
    wrong_colour = next(c for c in COLOURS if c != first.colour)
    bad = render_claim(ObjectClaim(Ref(first.shape, wrong_colour, first.size, first.row, first.col)))
    chain = [truth[0], bad, *truth[2:], "So the answer must be near.", "So the answer is 1 A.", "A cat sleeps."]
    check = check_chain_image(render(scene), chain)
    assert check.first_unfaithful == 1 and not check.faithful
    assert check.prefix == [truth[0]]
    assert [c.kind for c in check.sentences] == [PERCEPTION] * len(truth) + [REASONING] * 3
    assert [c.faithful for c in check.sentences] == [True, False, *[True] * (len(truth) - 2), None, None, None]
    assert check.sentences[-1].claim is None  # outside the grammar: not a perception claim


def test_faithful_chain_has_no_first_unfaithful_sentence():
    scene = generate_scene(3, 5)
    check = check_chain(perception_sentences(scene.objects), scene.objects)
    assert check.faithful and check.first_unfaithful is None
    assert check.prefix == perception_sentences(scene.objects)
