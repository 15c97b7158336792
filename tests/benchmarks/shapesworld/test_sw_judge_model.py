"""The learned ShapesWorld judge: its training calls are the proxy's own, its replies are right and
readable by the detector's parser, its tokens leave chains as the generator reads them, its trainer runs
end to end, and the committed weights say how they were made."""

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

# ruff: noqa: E402 -- after the import skips
from faithproxy.benchmarks.shapesworld.chains import reference_chain
from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_chain
from faithproxy.benchmarks.shapesworld.dataset import generate_items
from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
from faithproxy.benchmarks.shapesworld.model.corpus import VALIDATION_SEED
from faithproxy.benchmarks.shapesworld.model.judge_corpus import (
    HALLUCINATION_RATE,
    JUDGE_TOKENS,
    judge_messages,
    judge_sample,
    judge_samples,
    judge_seed,
    judge_stream,
)
from faithproxy.benchmarks.shapesworld.model.train_judge import JUDGE_WEIGHTS_DIR, score_replies, truth_of
from faithproxy.detectors.judge_prompt import ASK_DESCRIPTION, parse_judge_prompt_details, parse_judge_reply
from faithproxy.faithcore.types import StepKind

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def samples():
    return list(itertools.islice(judge_stream(judge_seed(0)), 400))


def test_every_reply_is_right_by_ground_truth_and_parses(samples):
    positives = 0
    for sample in samples:
        prompt = parse_judge_prompt_details(sample.text)  # the proxy's own prompt layout
        reply = parse_judge_reply(sample.target, prompt.sentences)
        assert reply.first_unfaithful == truth_of(sample), sample.target
        positives += reply.first_unfaithful is not None
        checks = check_chain(prompt.sentences, sample.scene.objects).sentences
        checked = range(prompt.already_checked, len(prompt.sentences))
        expected = {k: StepKind.PERCEPTION if checks[k].kind == PERCEPTION else StepKind.REASONING for k in checked}
        assert reply.kinds == expected  # one typing line per checked sentence, none for the context
        assert (reply.description is not None) == prompt.asks_description
        if reply.first_unfaithful is not None:
            assert reply.first_unfaithful >= prompt.already_checked  # context is never reported
    assert 0.3 < positives / len(samples) < 0.7  # both classes, in numbers the trainer can learn from


def test_windows_cover_context_errors_and_both_description_cases(samples):
    asked = given = context_error = 0
    for sample in samples:
        prompt = parse_judge_prompt_details(sample.text)
        asked += prompt.asks_description
        given += prompt.description is not None
        checks = check_chain(prompt.sentences, sample.scene.objects).sentences
        context_error += any(c.faithful is False for c in checks[: prompt.already_checked])
        assert ASK_DESCRIPTION not in sample.text or prompt.already_checked == 0
    assert asked and given and context_error  # an earlier miss in the context must be ignored, not reported


def test_judge_tokens_never_occur_inside_the_world_language():
    """Added tokens match anywhere: one inside a chain or a question would change its tokens."""
    for item in generate_items(VALIDATION_SEED, 300, hallucination_rate=HALLUCINATION_RATE):
        texts = [item.question.prompt, *item.chain.sentences]
        assert not any(token in text for token in JUDGE_TOKENS for text in texts), item.id


def test_the_judge_tokenizer_reads_the_system_prompt_short_and_chains_as_the_generator(samples):
    from transformers import AutoTokenizer

    generator = AutoTokenizer.from_pretrained(WEIGHTS_DIR)
    judge = AutoTokenizer.from_pretrained(WEIGHTS_DIR)
    judge.add_tokens(list(JUDGE_TOKENS))
    system = judge_messages(samples[0])[0]["content"]
    assert len(judge(system)["input_ids"]) <= 40 < len(generator(system)["input_ids"])
    for sample in samples[:50]:
        for sentence in parse_judge_prompt_details(sample.text).sentences:
            assert judge(sentence)["input_ids"] == generator(sentence)["input_ids"]


def test_scoring_counts_a_wrong_sentence_as_a_miss_and_a_false_flag(samples):
    positive = next(s for s in samples if truth_of(s) is not None)
    negative = next(s for s in samples if truth_of(s) is None)
    first = parse_judge_prompt_details(positive.text).already_checked + 1
    wrong = first + 1 if truth_of(positive) + 1 == first else first
    if wrong > len(parse_judge_prompt_details(positive.text).sentences):
        pytest.skip("window of one sentence")
    replies = [positive.target, "[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: " + str(first), "garbage"]
    right = score_replies([positive, negative, negative], replies)
    assert (right["tp"], right["fp"], right["tn"], right["parsed"]) == (1, 1, 1, round(2 / 3, 4))
    missed = score_replies([positive], [f"[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: {wrong}"])
    assert (missed["tp"], missed["fn"], missed["fp"]) == (0, 1, 1)


def test_samples_are_a_pure_function_of_the_seed():
    again = list(itertools.islice(judge_stream(judge_seed(0)), 20))
    assert [s.text for s in again] == [s.text for s in itertools.islice(judge_stream(judge_seed(0)), 20)]
    item = next(generate_items(VALIDATION_SEED, 1, hallucination_rate=1.0))
    assert judge_sample(item, random.Random(1)) == judge_sample(item, random.Random(1))


def test_a_twin_is_the_same_call_on_the_faithful_chain_and_only_looking_tells_them_apart():
    rng, twins = random.Random(3), 0
    for item in generate_items(VALIDATION_SEED, 200, hallucination_rate=1.0):
        drawn = judge_samples(item, rng, twins=1.0)
        if len(drawn) == 1:
            continue
        call, twin = drawn
        twins += 1
        assert truth_of(call) is not None and truth_of(twin) is None  # aimed at the error; its twin is true
        first, second = parse_judge_prompt_details(call.text), parse_judge_prompt_details(twin.text)
        assert second.sentences == list(reference_chain(item.scene, item.question).sentences[: len(second.sentences)])
        assert (second.question, second.description, second.asks_description) == (
            first.question,
            first.description,
            first.asks_description,
        )
        assert twin.scene == call.scene
        assert len(second.sentences) - second.already_checked >= 1  # the twin checks something
    assert twins > 100  # nearly every aimed call (70% of hallucinated items) gets its twin


def test_twins_zero_replays_the_first_judges_stream_draw_for_draw():
    """The committed judge's training_info names an earlier judge it was fine-tuned from; that one was
    trained on the twin-less stream, which must stay reproducible."""
    plain = [s.text for s in itertools.islice(judge_stream(judge_seed(0)), 60)]
    rng = random.Random(f"shapesworld-judge:{judge_seed(0)}")
    replayed = [judge_sample(item, rng).text for item in generate_items(judge_seed(0), 60, hallucination_rate=0.6)]
    assert plain == replayed
    assert plain != [s.text for s in itertools.islice(judge_stream(judge_seed(0), twins=1.0), 60)]


def test_smoke_training_saves_a_judge_with_its_tokens(tmp_path: Path):
    from transformers import AutoTokenizer

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faithproxy.benchmarks.shapesworld.model.train_judge",
            "--out",
            str(tmp_path),
            "--smoke",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["chosen"] == "step-000003" and {"f1", "parsed"} <= set(report["checkpoints"][0]["validation"])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "final")
    assert all(token in tokenizer.get_vocab() for token in JUDGE_TOKENS)
    info = json.loads((tmp_path / "final" / "training_info.json").read_text())
    assert info["validation_seed"] == VALIDATION_SEED and "command" in info


@pytest.mark.skipif(not (JUDGE_WEIGHTS_DIR / "config.json").is_file(), reason="no committed judge weights")
def test_committed_judge_is_small_documented_and_replies_in_the_format():
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from faithproxy.benchmarks.shapesworld.model.train_judge import judge_replies, validation_samples

    assert sum(p.stat().st_size for p in JUDGE_WEIGHTS_DIR.iterdir()) <= 30 * 1024 * 1024
    info = json.loads((JUDGE_WEIGHTS_DIR / "training_info.json").read_text())
    assert {"step", "command", "validation", "validation_seed"} <= set(info)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(JUDGE_WEIGHTS_DIR, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(JUDGE_WEIGHTS_DIR)
    calls = validation_samples(10)
    scored = score_replies(calls, judge_replies(model, processor, calls))
    assert scored["parsed"] == 1.0  # every reply is one the detector reads; rightness is the benchmark's
