"""Training examples for the generator's two auxiliary skills, built with the proxy's own prompts.

Regeneration: the faithful prefix and a wrong perception sentence -> the corrected sentence in square
brackets (`regenerators/prompts.py`). Self-assessment: the prefix and a sentence -> FAITHFUL or
UNFAITHFUL (`detectors/self_check_prompt.py`). Using the proxy's prompt builders keeps the training
text identical to what the proxy will send at inference. Each example goes with its scene's image.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from faithproxy.benchmarks.shapesworld.chains import Chain, Hallucination
from faithproxy.benchmarks.shapesworld.claims import PERCEPTION
from faithproxy.benchmarks.shapesworld.language import parse_claim, render_claim
from faithproxy.benchmarks.shapesworld.perturb import perturb_claim
from faithproxy.benchmarks.shapesworld.questions import Question
from faithproxy.benchmarks.shapesworld.scenes import Scene
from faithproxy.detectors.self_check_prompt import build_self_check_prompt
from faithproxy.regenerators.prompts import build_regeneration_prompt


@dataclass(frozen=True)
class TextExample:
    """A prompt (sent with the scene's image) and the exact reply to train on."""

    task: str  # "regeneration" | "self_check"
    prompt: str
    target: str


def regeneration_example(question: Question, hallucination: Hallucination) -> TextExample:
    chain = hallucination.chain
    k = chain.first_unfaithful
    assert k is not None
    prompt = build_regeneration_prompt(question.prompt, chain.sentences[:k], chain.sentences[k])
    return TextExample("regeneration", prompt, f"[{hallucination.correction}]")


def self_check_examples(scene: Scene, question: Question, chain: Chain, rng: random.Random) -> list[TextExample]:
    """A FAITHFUL and an UNFAITHFUL example at one perception step of the chain's faithful prefix.

    Both share the prefix, so the pair differs only in the sentence being judged. Empty when no
    sentence could be perturbed.
    """
    end = len(chain.steps) if chain.first_unfaithful is None else chain.first_unfaithful
    positions = [i for i in range(end) if chain.steps[i].kind == PERCEPTION]
    rng.shuffle(positions)
    for i in positions:
        claim = parse_claim(chain.steps[i].text)
        wrong = None if claim is None else perturb_claim(claim, scene.objects, rng)
        if wrong is None:
            continue
        prefix = chain.sentences[:i]
        return [
            TextExample(
                "self_check", build_self_check_prompt(question.prompt, prefix, chain.steps[i].text), "FAITHFUL"
            ),
            TextExample(
                "self_check", build_self_check_prompt(question.prompt, prefix, render_claim(wrong)), "UNFAITHFUL"
            ),
        ]
    return []
