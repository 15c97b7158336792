import random

from faithproxy.benchmarks.shapesworld.chains import hallucinated_chain, reference_chain
from faithproxy.benchmarks.shapesworld.claims import check_chain
from faithproxy.benchmarks.shapesworld.examples import regeneration_example, self_check_examples
from faithproxy.benchmarks.shapesworld.questions import QTYPES, make_question
from faithproxy.detectors.self_check_prompt import build_self_check_prompt, parse_self_check
from faithproxy.regenerators.prompts import build_regeneration_prompt, parse_bracketed


def test_regeneration_examples_use_the_proxy_prompt_and_a_true_correction(fixed_scenes):
    made = 0
    for i, scene in enumerate(fixed_scenes[:100]):
        rng = random.Random(i)
        question = make_question(scene, rng, QTYPES[i % len(QTYPES)])
        hallucination = hallucinated_chain(scene, question, rng)
        if hallucination is None:
            continue
        example = regeneration_example(question, hallucination)
        k = hallucination.chain.first_unfaithful
        sentences = hallucination.chain.sentences
        assert example.prompt == build_regeneration_prompt(question.prompt, sentences[:k], sentences[k])
        corrected = parse_bracketed(example.target)
        assert example.target == f"[{corrected}]"
        assert check_chain([*sentences[:k], corrected], scene.objects).faithful
        made += 1
    assert made >= 90


def test_self_check_examples_come_in_faithful_unfaithful_pairs(fixed_scenes):
    for i, scene in enumerate(fixed_scenes[:100]):
        rng = random.Random(i)
        question = make_question(scene, rng, QTYPES[i % len(QTYPES)])
        faithful, unfaithful = self_check_examples(scene, question, reference_chain(scene, question), rng)
        assert (parse_self_check(faithful.target), parse_self_check(unfaithful.target)) == (True, False)
        head, _, judged = faithful.prompt.rpartition("\nNext step: ")
        judged = judged.split("\n")[0]
        prefix = head.split("Steps so far:\n", 1)[1]
        prefix_lines = [] if prefix == "(none)" else prefix.split("\n")
        assert faithful.prompt == build_self_check_prompt(question.prompt, prefix_lines, judged)
        wrong = unfaithful.prompt.rpartition("\nNext step: ")[2].split("\n")[0]
        assert unfaithful.prompt == build_self_check_prompt(question.prompt, prefix_lines, wrong)
        assert check_chain([*prefix_lines, judged], scene.objects).faithful
        assert check_chain([*prefix_lines, wrong], scene.objects).first_unfaithful == len(prefix_lines)
