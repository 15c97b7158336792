"""What the model is trained on: chat messages for its three tasks, and seeded streams of them.

A `Sample` is one chat request (the scene's image first, then the text, as the proxy's callers send
it) and the exact reply to learn. Generator samples pair a question with its *reference* chain, so
every perception error the trained model makes is its own. Regeneration and self-check samples come
from `shapesworld.examples`, which builds them with the proxy's own prompt templates.

Each task draws from its own item stream (`shapesworld.dataset.generate_items`) with a seed derived
from the run's seed, so the stream is a pure function of (seed, task, position). The held-out seed is
outside every training seed's range.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from PIL import Image

from faithproxy.benchmarks.shapesworld.chains import ONE_STEP, reference_chain
from faithproxy.benchmarks.shapesworld.dataset import JOINED_EXISTENCE, Item, generate_items, item_examples
from faithproxy.benchmarks.shapesworld.questions import QTYPES
from faithproxy.benchmarks.shapesworld.scenes import Scene, render
from faithproxy.benchmarks.shapesworld.world import COLOURS, SHAPES

GENERATOR, REGENERATION, SELF_CHECK = "generator", "regeneration", "self_check"
TASKS = (GENERATOR, REGENERATION, SELF_CHECK)
# A training-only drill, not a skill the proxy uses: say the letter of each option, named in a given
# order. It is the lookup at the end of every chain ("So the answer is blue" -> " A"), four times a
# sample instead of once, under a prompt of its own so that it never competes with the chain.
LETTERS = "letters"
# A second drill, for the shortcut the first one allowed: there each option is named once, so the
# last letter follows by elimination and the model learned that instead of the lookup. Here four
# options are drawn with replacement, so only finding each in the prompt gives its letter.
LOOKUP = "lookup"
# A third: reference chains whose loss is their option letters only. The lookup drill taught the
# lookup with one distractor per word; in a chain the option's word also fills the perception and
# reasoning sentences, and there the lookup stayed near chance for attribute and existence questions.
ANSWER = "answer"
# A fourth, for the reasoning of existence chains: reference chains of existence questions only,
# whose loss is their reasoning (everything from the first "So"). In the G task existence is one
# question in five, too few to learn a new way of reasoning about it (`chains.BY_OBJECT`) quickly.
# Tried with BY_OBJECT and not used by the committed model (see README, runs 11-12).
EXISTENCE = "existence"
# A fifth: the lookup drill on existence questions only, whose four options share colours and shapes
# ("red-square", "red-circle", "blue-square", ...): with joined options (`questions.join_existence`)
# each is one token, and this drill asks the lookup to tell such tokens apart.
LOOKUP_EXISTENCE = "lookup_existence"
# A sixth, for reasoning over a corrected prefix: reference chains of every question type whose loss
# is their reasoning only, as E is for existence. Run through the proxy, the model's answers were as
# often right after a chain with a perception error as after one without (61% and 64% of 500
# held-out chains), so a fixed perception step changed answers at random; what reads the object list
# is what needs teaching, not what writes it (more perception teaching would also push the error
# rate below the 5-30% band).
REASONING = "reasoning"

MIN_TRAINING_SEED = 1000  # every item seed training draws is at least this (task_seed, drill_seed)
HELDOUT_SEED = 999
TOKENIZER_SEED = 998
# Scenes for choosing among checkpoints, so that the held-out figures are not also what chose the
# model: no training stream draws them either.
VALIDATION_SEED = 997
TOKENIZER_ITEMS = 3000
HALLUCINATION_RATE = 0.5  # of the auxiliary streams' items: the rest give self-check examples only


def task_seed(seed: int, task: str) -> int:
    if seed < 0:
        raise ValueError("the training seed must be >= 0")
    return MIN_TRAINING_SEED + 3 * seed + TASKS.index(task)


@dataclass(frozen=True)
class Sample:
    task: str
    scene: Scene
    text: str  # the user message's text (the image goes before it)
    target: str  # the reply, without the end-of-message token

    def image(self) -> Image.Image:
        return render(self.scene)


def user_message(text: str, image_url: str | None = None) -> dict[str, Any]:
    """The one user turn: the image, then the text. Without a URL the image part is a placeholder
    that the chat template renders exactly as it renders an `image_url` part."""
    image: dict[str, Any] = (
        {"type": "image"}
        if image_url is None
        else {
            "type": "image_url",
            "image_url": {"url": image_url},
        }
    )
    return {"role": "user", "content": [image, {"type": "text", "text": text}]}


# Item seeds of the drills are far above the tasks' (1000 + 3 * seed + k) and apart from each other.
_DRILL_SEED_BASE = {
    REASONING: 400_000,
    LETTERS: 500_000,
    LOOKUP_EXISTENCE: 600_000,
    LOOKUP: 700_000,
    ANSWER: 800_000,
    EXISTENCE: 900_000,
}


def drill_seed(seed: int, drill: str) -> int:
    """Item seed of a drill (a key of _DRILL_SEED_BASE) in the run of training seed `seed`."""
    if seed < 0:
        raise ValueError("the training seed must be >= 0")
    return _DRILL_SEED_BASE[drill] + seed


def letters_sample(item: Item, rng: random.Random) -> Sample:
    """The item's options in a shuffled order, each followed by its letter: "Letters: red B. blue A. ..."."""
    order = list(item.question.options)
    rng.shuffle(order)
    text = f"{item.question.prompt}\nGive the letter of each of these options: {'; '.join(order)}."
    said = " ".join(f"{option} {item.question.letter_of(option)}." for option in order)
    return Sample(LETTERS, item.scene, text, f"Letters: {said}")


def lookup_sample(item: Item, rng: random.Random, asks: int = 4) -> Sample:
    """`asks` options drawn with replacement, each followed by its letter: "Found: red B. red B. blue A. ..."."""
    drawn = [rng.choice(item.question.options) for _ in range(asks)]
    text = f"{item.question.prompt}\nLook up the letter of: {'; '.join(drawn)}."
    said = " ".join(f"{option} {item.question.letter_of(option)}." for option in drawn)
    return Sample(LOOKUP, item.scene, text, f"Found: {said}")


def lookup_stream(
    item_seed: int, *, task: str = LOOKUP, joined: bool = JOINED_EXISTENCE, qtypes: Sequence[str] = QTYPES
) -> Iterator[Sample]:
    """Lookup drill samples under the task name `task` (LOOKUP; LOOKUP_EXISTENCE with existence
    questions only)."""
    rng = random.Random(f"shapesworld-model:{item_seed}:{LOOKUP}")
    items = _items(item_seed, 0.0, qtypes=qtypes, joined=joined)
    return (replace(lookup_sample(item, rng), task=task) for item in items)


def answer_stream(item_seed: int, *, existence: str = ONE_STEP, joined: bool = JOINED_EXISTENCE) -> Iterator[Sample]:
    """Generator samples under the task name ANSWER (the trainer weighs only their letters)."""
    return chain_drill_stream(item_seed, ANSWER, existence=existence, joined=joined)


def existence_stream(item_seed: int, *, existence: str = ONE_STEP, joined: bool = JOINED_EXISTENCE) -> Iterator[Sample]:
    """Generator samples of existence questions only, under the task name EXISTENCE (the trainer
    weighs only their reasoning)."""
    return chain_drill_stream(item_seed, EXISTENCE, existence=existence, joined=joined, qtypes=("existence",))


def reasoning_stream(item_seed: int, *, existence: str = ONE_STEP, joined: bool = JOINED_EXISTENCE) -> Iterator[Sample]:
    """Generator samples of every question type under the task name REASONING (the trainer weighs
    only their reasoning)."""
    return chain_drill_stream(item_seed, REASONING, existence=existence, joined=joined)


def chain_drill_stream(
    item_seed: int, task: str, *, existence: str, joined: bool, qtypes: Sequence[str] = QTYPES
) -> Iterator[Sample]:
    """Reference chains under a drill's task name: the text is the generator's, the trainer weighs
    the tokens by the task."""
    items = _items(item_seed, 0.0, qtypes=qtypes, joined=joined)
    return (replace(generator_sample(item, existence=existence), task=task) for item in items)


def letters_stream(item_seed: int, *, joined: bool = JOINED_EXISTENCE) -> Iterator[Sample]:
    rng = random.Random(f"shapesworld-model:{item_seed}:{LETTERS}")
    return (letters_sample(item, rng) for item in _items(item_seed, 0.0, joined=joined))


def generator_sample(item: Item, *, existence: str = ONE_STEP) -> Sample:
    """A reference chain; `existence`: how it reasons about existence questions (see `chains`)."""
    chain = reference_chain(item.scene, item.question, existence=existence)
    return Sample(GENERATOR, item.scene, item.question.prompt, chain.text())


def stream(
    item_seed: int, task: str, *, existence: str = ONE_STEP, joined: bool = JOINED_EXISTENCE
) -> Iterator[Sample]:
    """Endless samples of one task from the items of `item_seed` (`task_seed(...)` when training);
    `joined`: existence options as one word each (`questions.join_existence`)."""
    if task == GENERATOR:
        return (generator_sample(item, existence=existence) for item in _items(item_seed, 0.0, joined=joined))
    return auxiliary_stream(item_seed, task, joined=joined)


def _items(
    item_seed: int, hallucination_rate: float, qtypes: Sequence[str] = QTYPES, *, joined: bool = JOINED_EXISTENCE
) -> Iterator[Item]:
    i = 0
    while True:
        yield from generate_items(
            item_seed, 256, start=i, hallucination_rate=hallucination_rate, qtypes=qtypes, joined=joined
        )
        i += 256


def auxiliary_stream(item_seed: int, task: str, *, joined: bool = JOINED_EXISTENCE) -> Iterator[Sample]:
    """Regeneration or self-check samples; a self-check item gives one of its FAITHFUL/UNFAITHFUL
    pair (chosen by a seeded coin) so that consecutive samples are different scenes."""
    rate = 1.0 if task == REGENERATION else HALLUCINATION_RATE
    rng = random.Random(f"shapesworld-model:{item_seed}:{task}")
    for item in _items(item_seed, rate, joined=joined):
        examples = [e for e in item_examples(item) if e.task == task]
        if examples:
            example = examples[0] if task == REGENERATION else rng.choice(examples)
            yield Sample(task, item.scene, example.prompt, example.target)


def tokenizer_texts(count: int = TOKENIZER_ITEMS) -> list[str]:
    """Every kind of prompt and reply the model sees, from a seed of their own. Existence options in
    two words: the BPE was trained before the joined ones existed, and they are added tokens
    (`add_joined_tokens`), so that it stays the same."""
    texts = []
    for item in generate_items(TOKENIZER_SEED, count, hallucination_rate=0.5, joined=False):
        sample = generator_sample(item)
        texts += [sample.text, sample.target]
        for example in item_examples(item):
            texts += [example.prompt, example.target]
    return texts


def shapesworld_tokenizer(count: int = TOKENIZER_ITEMS) -> Any:
    """The byte-level BPE of `tinyvlm.tokenizer`, trained on ShapesWorld texts (deterministic)."""
    from faithproxy.benchmarks.tinyvlm.tokenizer import train_tokenizer

    return train_tokenizer(tokenizer_texts(count))


# One token for each colour-shape pair as existence options write it (`questions.join_existence`).
JOINED_TOKENS = tuple(f"{colour}-{shape}" for colour in COLOURS for shape in SHAPES)


def add_joined_tokens(tokenizer: Any) -> list[int]:
    """Adds JOINED_TOKENS to the tokenizer as ordinary (non-special) added tokens, matched before
    the BPE runs; returns their ids. " red-square A" becomes " ", "red-square", " A": the space stays
    a token of its own, so the letter still follows the option's one token, as the lookup needs."""
    tokenizer.add_tokens(list(JOINED_TOKENS))
    return tokenizer.convert_tokens_to_ids(list(JOINED_TOKENS))
