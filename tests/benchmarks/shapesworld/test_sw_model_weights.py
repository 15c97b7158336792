"""The committed ShapesWorld model loads in transformers and answers held-out scenes with well-formed
chains; its training record says how it was made."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR  # noqa: E402

pytestmark = pytest.mark.skipif(not (WEIGHTS_DIR / "config.json").is_file(), reason="no committed weights")

MAX_BYTES = 30 * 1024 * 1024


@pytest.fixture(scope="module")
def model_and_processor():
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(WEIGHTS_DIR, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(WEIGHTS_DIR)


def test_weights_are_small_and_documented():
    assert sum(p.stat().st_size for p in WEIGHTS_DIR.iterdir()) <= MAX_BYTES
    info = json.loads((WEIGHTS_DIR / "training_info.json").read_text())
    assert {"seed", "step", "command", "heldout_transformers"} <= set(info)


def test_answers_heldout_scenes_with_well_formed_chains(model_and_processor):
    from faithproxy.benchmarks.shapesworld.model.greedy import generate_one
    from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items, score_reply
    from faithproxy.benchmarks.shapesworld.scenes import render

    model, processor = model_and_processor
    scores = [
        score_reply(item, generate_one(model, processor, item.question.prompt, render(item.scene)))
        for item in heldout_items(5)  # one of each question type
    ]
    assert all(s.well_formed and s.perception_steps >= 2 for s in scores), [s.reply for s in scores]


def test_letter_lookup_reads_two_letters_per_chain_and_four_per_drill_and_lookup(model_and_processor):
    """The diagnostic behind benchmarks/shapesworld/README.md's letter figures counts the letter tokens it means to."""
    import itertools

    from faithproxy.benchmarks.shapesworld.model.corpus import (
        HELDOUT_SEED,
        generator_sample,
        letters_stream,
        lookup_stream,
    )
    from faithproxy.benchmarks.shapesworld.model.letter_lookup import letter_hits
    from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items

    model, processor = model_and_processor
    chains = letter_hits(model, processor, [generator_sample(i) for i in heldout_items(3)])
    drills = letter_hits(model, processor, itertools.islice(letters_stream(HELDOUT_SEED), 3))
    lookups = letter_hits(model, processor, itertools.islice(lookup_stream(HELDOUT_SEED), 3))
    assert [len(h) for h in chains] == [2, 2, 2] and [len(h) for h in drills] == [4, 4, 4]
    assert [len(h) for h in lookups] == [4, 4, 4]
    assert all(chain[1] for chain in chains)  # "The answer is X." after </think> repeats the chain's letter


@pytest.mark.parametrize("existence", ["one-step", "by-object"])
def test_existence_check_counts_what_it_reports(existence):
    """The diagnostic behind benchmarks/shapesworld/README.md's existence figures: its counts add up, and a
    BY_OBJECT chain has object-sentence letters to score while a ONE_STEP chain has none."""
    from faithproxy.benchmarks.shapesworld.model.existence_check import measure

    result = measure(WEIGHTS_DIR, 3, existence)
    in_image, not_in_image = result["right_in_the_image"], result["right_not_in_the_image"]
    assert in_image[1] + not_in_image[1] == 3 and in_image[0] + not_in_image[0] == result["right"]
    assert 0 <= result["option_text_right"] <= 3 and 0 <= result["well_formed"] <= 3
    split = result["right_text_letter_right_by_options_ending_alike"]
    assert sum(n for _, n in split.values()) == result["option_text_right"]
    assert all(k in {"1", "2", "3", "4"} and 0 <= right <= n for k, (right, n) in split.items())
    objects = result["teacher_forced"]["object_letters_right"]
    assert (objects[1] > 0) == (existence == "by-object") and 0 <= objects[0] <= objects[1]
    assert result["teacher_forced"]["answer_letter_right"][1] == 3
    lookups = result["teacher_forced"]["lookup_drill_letters_right"]
    assert set(lookups) == {"existence", "other types"}
    assert all(n == 4 * 3 and 0 <= right <= n for right, n in lookups.values())  # 4 letters a sample
