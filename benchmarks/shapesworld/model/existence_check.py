"""How a checkpoint does on existence questions, the type it answers worst, and why.

    python -m faithproxy.benchmarks.shapesworld.model.existence_check benchmarks/shapesworld/model/weights --n 100
    python -m faithproxy.benchmarks.shapesworld.model.existence_check var/sw-obj/checkpoints/step-015856 \
        --existence by-object

On the first `n` existence questions of the held-out set, greedy in transformers: answers right (split
into "in the image" and "not in the image" questions), chains whose answer step names the right option
text, and chains whose letter is the letter of the text they named; of those naming the right text,
how many got the letter, split by how many options end in the same word as the right one. Then
teacher-forced on reference chains in the given existence style: how often the most likely token is
the right letter, in the object sentences of a BY_OBJECT chain ("So red triangle C is an option.")
and in the answer step; and the letters of the lookup drill (`corpus.lookup_sample`) on `n` held-out
existence questions and on `n` of the other types.
Every distractor of an existence question shares a word with the gold option, so with two-word options
each of these letters is a lookup keyed on two words (the other question types need one); with joined
options ("red-square", `questions.join_existence`), one token. Chance is 25%.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import torch

from faithproxy.benchmarks.shapesworld.chains import ONE_STEP
from faithproxy.benchmarks.shapesworld.model.corpus import HELDOUT_SEED, generator_sample, lookup_stream
from faithproxy.benchmarks.shapesworld.model.greedy import generate_in_batches
from faithproxy.benchmarks.shapesworld.model.letter_lookup import checkpoint_cli, letter_hits
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items, score_reply
from faithproxy.benchmarks.shapesworld.questions import QTYPES
from faithproxy.benchmarks.shapesworld.scenes import render


def measure(path: Path, n: int, existence: str = ONE_STEP) -> dict[str, Any]:
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(path)
    # held-out items cycle through the five types, so 5n of them hold n existence questions
    items = [i for i in heldout_items(5 * n) if i.question.qtype == "existence"][:n]
    replies = generate_in_batches(
        model, processor, [i.question.prompt for i in items], [render(i.scene) for i in items]
    )
    scores = [score_reply(item, reply) for item, reply in zip(items, replies, strict=True)]
    negated = [s.correct for s, i in zip(scores, items, strict=True) if i.question.spec.negated]
    # Of the chains that name the right option text: is their letter right, by how many options end in
    # the same word as the gold? A lookup keyed on the last word alone picks among those: 1/2, 1/3, 1/4.
    sharing: dict[str, list[int]] = {}
    for score, item in zip(scores, items, strict=True):
        if score.option_text_correct:
            # joined options ("red-square") are still told apart by their last word for this tally
            last = _last_word(item.question.gold_text)
            same = sum(_last_word(o) == last for o in item.question.options)
            tally = sharing.setdefault(str(same), [0, 0])
            tally[0] += score.correct
            tally[1] += 1
    # letters of a chain in order: any object sentences', the answer step's, then the one after </think>
    hits = letter_hits(model, processor, (generator_sample(i, existence=existence) for i in items))
    object_letters = [h for row in hits for h in row[:-2]]
    # the lookup drill (four options drawn with replacement, each to be given its letter) on held-out
    # existence questions, whose options share colours and shapes, and on the other types' questions
    lookups = {}
    for name, qtypes in (("existence", ("existence",)), ("other types", tuple(q for q in QTYPES if q != "existence"))):
        rows = letter_hits(model, processor, itertools.islice(lookup_stream(HELDOUT_SEED, qtypes=qtypes), n))
        letters = [h for row in rows for h in row[:4]]
        lookups[name] = [sum(letters), len(letters)]
    return {
        "checkpoint": str(path),
        "questions": n,
        "right": sum(s.correct for s in scores),
        "right_in_the_image": [sum(s.correct for s in scores) - sum(negated), n - len(negated)],
        "right_not_in_the_image": [sum(negated), len(negated)],
        "option_text_right": sum(s.option_text_correct for s in scores),
        "letter_matches_text": sum(s.letter_matches_text for s in scores),
        "well_formed": sum(s.well_formed for s in scores),
        "right_text_letter_right_by_options_ending_alike": dict(sorted(sharing.items())),
        "teacher_forced": {
            "existence": existence,
            "object_letters_right": [sum(object_letters), len(object_letters)],
            "answer_letter_right": [sum(row[-2] for row in hits), len(hits)],
            "lookup_drill_letters_right": lookups,
        },
    }


def _last_word(option: str) -> str:
    return option.replace("-", " ").split()[-1]


def main(argv: list[str] | None = None) -> int:
    return checkpoint_cli(argv, __doc__ or "", measure, 100, "held-out existence questions")


if __name__ == "__main__":
    sys.exit(main())
