"""What the learned ShapesWorld judge is trained on: faithproxy's own judge calls and their right replies.

A judge sample is one call of the `judge` detector as the proxy makes it (`detectors.judge_prompt`):
the system prompt, the scene's image, and a user turn holding the question, the chain so far as
numbered sentences and which of them to check, with or without a request to describe the image first.
The reply is written in the detector's reply format from the scene's ground truth (`shapesworld.claims`):
the description (when asked), a typing line per checked sentence, the verdict and the number of the
first false perception sentence among those checked.

Chains come from `dataset.generate_items` with hallucinations (a perturbed belief carried through the
chain, so an error can be a count, an invented object or a wrong colour, size or place), and the window
of checked sentences is drawn the way the proxy's calls fall: mostly one or two new sentences, the rest
of the chain as context, which may itself hold an error the judge missed earlier (never to be reported).

The system prompt is long (about 760 tokens of the generator's BPE) and the same in every call, so the
judge's tokenizer holds each of its lines, and the fixed phrases of the turn and the reply, as added
tokens (`JUDGE_TOKENS`): the model still reads the whole prompt, in about 40 tokens. A prompt whose
wording differs from these lines falls back to the BPE and reads as text the model never saw.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

from faithproxy.benchmarks.shapesworld.chains import reference_chain
from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_chain
from faithproxy.benchmarks.shapesworld.dataset import Item, generate_items
from faithproxy.benchmarks.shapesworld.judge_reply import describe
from faithproxy.benchmarks.shapesworld.model.corpus import Sample, user_message
from faithproxy.detectors.judge_prompt import (
    ASK_DESCRIPTION,
    JUDGE_SYSTEM_PROMPT,
    build_judge_prompt,
)

JUDGE = "judge"
HALLUCINATION_RATE = 0.6  # of the items a judge stream draws: the rest keep their reference chain
JUDGE_SEED_BASE = 300_000  # item seeds of the judge's stream (training), far from the generator's
# How many new sentences a call checks: the proxy batches what finished while the judge was busy.
NEW_SENTENCES = (1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 5, 6)
AIM_AT_ERROR = 0.7  # of hallucinated items: the window holds the first false sentence
ASK_FIRST = 0.6  # of windows starting at sentence 1: asked for a description (else it is given)

# Added tokens: each line of the system prompt, and the fixed phrases of the turn and of the reply.
# Longer phrases first does not matter (the tokenizer matches the longest), but none may be inside a
# ShapesWorld sentence, or a chain would be tokenized differently from the generator's.
JUDGE_TOKENS: tuple[str, ...] = (
    *(line for line in JUDGE_SYSTEM_PROMPT.split("\n") if line.strip()),
    "Reasoning chain so far, one sentence per line:",
    "Your description of the image, from your first look at it:",
    ASK_DESCRIPTION,
    "are context only.",
    "is context only.",
    "Sentence",
    "[Image description]:",
    "[Faithfulness]:",
    "[First unfaithful sentence]:",
    "PERCEPTION",
    "REASONING",
    "UNFAITHFUL",
    "FAITHFUL",
)


def judge_messages(sample: Sample, image_url: str | None = None) -> list[dict[str, Any]]:
    """The chat the judge backend sends: the system prompt, then the image and the user turn."""
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, user_message(sample.text, image_url)]


def judge_reply_text(item: Item, sentences: list[str], already_checked: int, ask_description: bool) -> str:
    """The right reply to a call about `sentences`, checking those from `already_checked` on."""
    checks = check_chain(sentences, item.scene.objects).sentences
    lines = [f"[Image description]: {describe(item.scene)}"] if ask_description else []
    first = None
    for k in range(already_checked, len(sentences)):
        kind = "PERCEPTION" if checks[k].kind == PERCEPTION else "REASONING"
        lines.append(f"Sentence {k + 1}: {kind}")
        if first is None and checks[k].faithful is False:
            first = k + 1
    if first is None:
        lines.append("[Faithfulness]: FAITHFUL")
    else:
        lines += ["[Faithfulness]: UNFAITHFUL", f"[First unfaithful sentence]: {first}"]
    return "\n".join(lines)


def judge_sample(item: Item, rng: random.Random) -> Sample:
    """One judge call about a window of the item's chain, and its right reply."""
    return judge_samples(item, rng, twins=0.0)[0]


def judge_samples(item: Item, rng: random.Random, twins: float) -> list[Sample]:
    """A judge call about a window of the item's chain; when the window holds the chain's first false
    sentence, with probability `twins` also the same call about the item's faithful chain (same scene,
    question and window): its twin.

    Why twins: a window aimed at an error is nearly always a lone perception sentence, so without its
    faithful twin "one new perception sentence" predicts UNFAITHFUL on its own, and the judge learns
    that instead of reading the image (the first judge flagged 81% of the generator's true
    object-in-cell sentences, and nearly every faithful sentence checked alone). A twin differs from
    its call only where the perturbed belief does, so only looking tells the two apart."""
    sentences = item.chain.sentences
    new = rng.choice(NEW_SENTENCES)
    first_false = item.chain.first_unfaithful
    aimed = first_false is not None and rng.random() < AIM_AT_ERROR
    if aimed:
        end = rng.randint(first_false + 1, min(len(sentences), first_false + new))
    else:
        end = rng.randint(1, len(sentences))
    start = max(0, end - new)
    ask = start == 0 and rng.random() < ASK_FIRST
    samples = [_call(item, sentences, start, end, ask)]
    if aimed and twins and rng.random() < twins:
        faithful = reference_chain(item.scene, item.question).sentences
        end = min(end, len(faithful))
        samples.append(_call(item, faithful, min(start, end - 1), end, ask))
    return samples


def _call(item: Item, sentences: Sequence[str], start: int, end: int, ask: bool) -> Sample:
    prompt = build_judge_prompt(
        item.question.prompt,
        list(sentences[:end]),
        already_checked=start,
        description=None if ask else describe(item.scene),
        ask_description=ask,
    )
    return Sample(JUDGE, item.scene, prompt, judge_reply_text(item, list(sentences[:end]), start, ask))


def judge_stream(item_seed: int, twins: float = 0.0) -> Iterator[Sample]:
    """Endless judge samples from the items of `item_seed` (seeded: a pure function of the seed and
    `twins`; twins=0 is the stream the first judge was trained on, draw for draw)."""
    rng = random.Random(f"shapesworld-judge:{item_seed}")
    i = 0
    while True:
        for item in generate_items(item_seed, 256, start=i, hallucination_rate=HALLUCINATION_RATE):
            yield from judge_samples(item, rng, twins)
        i += 256


def judge_seed(seed: int) -> int:
    if seed < 0:
        raise ValueError("the training seed must be >= 0")
    return JUDGE_SEED_BASE + seed
