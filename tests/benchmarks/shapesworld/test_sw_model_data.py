"""The ShapesWorld model's training data, held-out set and scoring (no torch needed)."""

import dataclasses
import itertools

import pytest

from faithproxy.benchmarks.shapesworld.chains import hallucinated_chain, reference_chain
from faithproxy.benchmarks.shapesworld.dataset import generate_items
from faithproxy.benchmarks.shapesworld.model.corpus import (
    ANSWER,
    EXISTENCE,
    GENERATOR,
    HELDOUT_SEED,
    LETTERS,
    LOOKUP,
    REGENERATION,
    SELF_CHECK,
    TASKS,
    answer_stream,
    drill_seed,
    existence_stream,
    generator_sample,
    letters_stream,
    lookup_stream,
    stream,
    task_seed,
    tokenizer_texts,
    user_message,
)
from faithproxy.benchmarks.shapesworld.model.scoring import (
    heldout_items,
    regeneration_ok,
    score_reply,
    self_check_ok,
    summarise,
)
from faithproxy.benchmarks.shapesworld.questions import QTYPES


def take(task: str, n: int, seed: int = 0):
    return list(itertools.islice(stream(task_seed(seed, task), task), n))


@pytest.mark.parametrize("task", TASKS)
def test_streams_are_deterministic_and_keep_their_task(task):
    a, b = take(task, 12), take(task, 12)
    assert a == b
    assert all(s.task == task for s in a)
    assert len({s.scene.index for s in a}) == len(a)  # consecutive samples are different scenes


def test_training_seeds_never_reach_the_heldout_validation_or_tokenizer_seed():
    from faithproxy.benchmarks.shapesworld.model.corpus import (
        _DRILL_SEED_BASE,
        MIN_TRAINING_SEED,
        TOKENIZER_SEED,
        VALIDATION_SEED,
        drill_seed,
    )

    seeds = {task_seed(seed, task) for seed in range(1000) for task in TASKS}
    assert len(seeds) == 3000
    drills = {drill_seed(seed, drill) for seed in range(1000) for drill in _DRILL_SEED_BASE}
    assert len(drills) == 1000 * len(_DRILL_SEED_BASE) and not drills & seeds
    assert min(seeds | drills) >= MIN_TRAINING_SEED > max(HELDOUT_SEED, TOKENIZER_SEED, VALIDATION_SEED)
    assert len({HELDOUT_SEED, TOKENIZER_SEED, VALIDATION_SEED}) == 3
    with pytest.raises(ValueError):
        task_seed(-1, GENERATOR)


def test_letters_drill_names_each_option_with_its_letter_under_its_own_prompt():
    samples = list(itertools.islice(letters_stream(drill_seed(0, LETTERS)), 30))
    assert samples == list(itertools.islice(letters_stream(drill_seed(0, LETTERS)), 30))
    generator_prompts = {s.text for s in take(GENERATOR, 30)}
    for sample in samples:
        assert sample.task == LETTERS and sample.text not in generator_prompts
        question, _, asked = sample.text.rpartition("\nGive the letter of each of these options: ")
        order = asked.removesuffix(".").split("; ")
        options = dict(line.removeprefix("- ").rsplit(" ", 1) for line in question.split("\n")[1:])
        assert sorted(order) == sorted(options)
        assert sample.target == "Letters: " + " ".join(f"{o} {options[o]}." for o in order)


def test_lookup_drill_draws_options_with_replacement_and_names_their_letters():
    samples = list(itertools.islice(lookup_stream(drill_seed(0, LOOKUP)), 60))
    assert samples == list(itertools.islice(lookup_stream(drill_seed(0, LOOKUP)), 60))
    repeats = 0
    for sample in samples:
        assert sample.task == LOOKUP
        question, _, asked = sample.text.rpartition("\nLook up the letter of: ")
        drawn = asked.removesuffix(".").split("; ")
        options = dict(line.removeprefix("- ").rsplit(" ", 1) for line in question.split("\n")[1:])
        assert len(drawn) == 4 and set(drawn) <= set(options)
        assert sample.target == "Found: " + " ".join(f"{o} {options[o]}." for o in drawn)
        repeats += len(set(drawn)) < 4
    assert repeats > 30  # with replacement, most draws repeat an option: no elimination


def test_answer_drill_is_reference_chains_of_its_own_items():
    samples = list(itertools.islice(answer_stream(drill_seed(0, ANSWER)), 10))
    items = itertools.islice(generate_items(drill_seed(0, ANSWER), 10), 10)
    assert samples == [dataclasses.replace(generator_sample(item), task=ANSWER) for item in items]


def test_existence_drill_is_reference_chains_of_existence_questions_in_the_asked_style():
    from faithproxy.benchmarks.shapesworld.chains import BY_OBJECT

    items = list(generate_items(drill_seed(0, EXISTENCE), 8, qtypes=("existence",)))
    assert {item.question.qtype for item in items} == {"existence"}
    for existence in ("one-step", BY_OBJECT):
        samples = list(itertools.islice(existence_stream(drill_seed(0, EXISTENCE), existence=existence), 8))
        want = [dataclasses.replace(generator_sample(i, existence=existence), task=EXISTENCE) for i in items]
        assert samples == want
    assert all(" is an option." in s.target for s in samples)  # BY_OBJECT: the seen kind that is an option


def test_drill_seeds_never_meet_each_other_the_tasks_or_the_heldout_seed():
    seeds = [{task_seed(s, t) for s in range(1000)} for t in TASKS]
    seeds += [{drill_seed(s, d) for s in range(1000)} for d in (LETTERS, LOOKUP, ANSWER, EXISTENCE)]
    assert len(set().union(*seeds)) == 7000 and HELDOUT_SEED not in set().union(*seeds)
    with pytest.raises(ValueError):
        drill_seed(-1, LOOKUP)


def test_generator_targets_are_reference_chains_and_aux_targets_have_their_shape():
    for sample in take(GENERATOR, 20):
        assert sample.target.startswith("<think>\n") and sample.target.rstrip(".")[-1] in "ABCD"
    assert all(s.target.startswith("[") and s.target.endswith("]") for s in take(REGENERATION, 10))
    verdicts = {s.target for s in take(SELF_CHECK, 40)}
    assert verdicts == {"FAITHFUL", "UNFAITHFUL"}


def test_image_placeholder_renders_like_an_image_url():
    """Training renders a placeholder image part; vLLM's callers send an image_url: same prompt text."""
    jinja2 = pytest.importorskip("jinja2")
    pytest.importorskip("tokenizers")  # tinyvlm.tokenizer, which holds the template, needs it
    from faithproxy.benchmarks.tinyvlm.tokenizer import CHAT_TEMPLATE

    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    a = template.render(messages=[user_message("Q?")], add_generation_prompt=True)
    b = template.render(messages=[user_message("Q?", "data:image/png;base64,AAAA")], add_generation_prompt=True)
    assert a == b and "<|vision_start|><|image_pad|><|vision_end|>Q?" in a


def test_tokenizer_corpus_holds_every_task():
    texts = tokenizer_texts(20)
    assert any(t.startswith("<think>") for t in texts)
    assert any(t.startswith("You are checking") for t in texts)
    assert "FAITHFUL" in texts and "UNFAITHFUL" in texts


def test_heldout_set_covers_every_question_type_equally():
    items = heldout_items(25)
    assert [i.question.qtype for i in items[:5]] == list(QTYPES)
    assert all(i.scene.seed == HELDOUT_SEED for i in items)


def test_reference_chains_score_perfectly():
    items = heldout_items(50)
    summary = summarise(items, [reference_chain(i.scene, i.question).text() for i in items]).to_dict()
    assert summary["perception_error_rate"] == 0.0 and summary["judge_error_rate"] == 0.0
    assert summary["accuracy"] == 1.0 and summary["min_accuracy"] == 1.0
    assert summary["well_formed"] == 1.0 and summary["unparsed_steps"] == 0
    assert summary["perception_steps"] == sum(1 + len(i.scene.objects) for i in items)


def test_hallucinated_chains_are_scored_as_their_labels_say():
    import random

    for item in heldout_items(40):
        hallucination = hallucinated_chain(item.scene, item.question, random.Random(item.id))
        if hallucination is None:
            continue
        chain = hallucination.chain
        score = score_reply(item, chain.text())
        assert score.perception_errors == sum(s.faithful is False for s in chain.steps) >= 1
        assert score.judge_errors == score.perception_errors
        assert score.correct == (chain.answer == item.question.gold_letter)


def test_malformed_replies_count_as_wrong_and_unparsed():
    item = heldout_items(1)[0]
    score = score_reply(item, "<think>\nThere is a blorp. So it is.\n</think>\n\nI do not know.")
    assert score.unparsed == 2 and score.perception_steps == 0  # "There is a blorp." and the last line
    assert not score.correct and not score.well_formed and score.answer is None


def test_auxiliary_replies_are_checked_against_the_scene():
    sample = take(REGENERATION, 1)[0]
    assert regeneration_ok(sample.scene, sample.target)
    assert not regeneration_ok(sample.scene, "no brackets")
    assert self_check_ok("FAITHFUL", "FAITHFUL") and not self_check_ok("UNFAITHFUL", "FAITHFUL")


def test_later_cycles_apply_only_after_their_step():
    pytest.importorskip("torch")
    from faithproxy.benchmarks.shapesworld.model.train import RunConfig, task_of_step

    before = [task_of_step(s, RunConfig()) for s in range(1, 41)]
    assert LETTERS not in before and before.count(GENERATOR) == 28
    run = RunConfig(cycles=((40, "GGLL"), (20, "GLRGGSGLGRGGSGLRGGSG")))
    assert [task_of_step(s, run) for s in range(1, 21)] == before[:20]  # a resumed run replays the same steps
    after = [task_of_step(s, run) for s in range(21, 41)]
    assert after.count(LETTERS) == 3 and after.count(REGENERATION) == 3 and after.count(SELF_CHECK) == 3
    assert [task_of_step(s, run) for s in range(41, 45)] == [GENERATOR, GENERATOR, LETTERS, LETTERS]


def test_cycle_option_is_checked():
    pytest.importorskip("torch")
    from faithproxy.benchmarks.shapesworld.model.train import main

    with pytest.raises(SystemExit):
        main(["--out", "unused", "--cycle", "12:GGQ"])
