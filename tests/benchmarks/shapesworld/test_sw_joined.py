"""Existence options written as one word ("red-square"): the questions, items, chains, streams and
tokens that carry them, and giving a trained model their tokens (`joined_vocab`)."""

import itertools
import random

import pytest

from faithproxy.benchmarks.shapesworld.chains import BY_OBJECT, BY_OPTION, reference_chain
from faithproxy.benchmarks.shapesworld.claims import REASONING
from faithproxy.benchmarks.shapesworld.dataset import generate_items
from faithproxy.benchmarks.shapesworld.model.corpus import (
    EXISTENCE,
    GENERATOR,
    JOINED_TOKENS,
    REGENERATION,
    SELF_CHECK,
    existence_stream,
    stream,
    tokenizer_texts,
)
from faithproxy.benchmarks.shapesworld.model.scoring import score_reply
from faithproxy.benchmarks.shapesworld.questions import (
    LETTERS,
    QTYPES,
    ExistenceSpec,
    join_existence,
    make_question,
    solve,
)
from faithproxy.benchmarks.shapesworld.world import COLOURS, SHAPES


def existence_questions(fixed_scenes):
    return [(scene, make_question(scene, random.Random(i), "existence")) for i, scene in enumerate(fixed_scenes)]


def test_joined_existence_question_keeps_its_answer_and_joins_each_option(fixed_scenes):
    for scene, question in existence_questions(fixed_scenes):
        joined = join_existence(question)
        assert joined.options == tuple(o.replace(" ", "-") for o in question.options)
        assert all(len(o.split()) == 1 for o in joined.options)
        assert joined.gold_letter == question.gold_letter and joined.text == question.text
        assert joined.options[LETTERS.index(joined.gold_letter)] == joined.gold_text
        assert solve(joined.spec, scene.objects) == joined.gold_text
        assert isinstance(joined.spec, ExistenceSpec) and joined.spec.joined
        assert joined.spec.candidates == question.spec.candidates
        assert join_existence(joined) == joined  # joining twice changes nothing


@pytest.mark.parametrize("qtype", [q for q in QTYPES if q != "existence"])
def test_other_question_types_are_left_as_they_are(qtype, fixed_scenes):
    for i, scene in enumerate(fixed_scenes[:10]):
        question = make_question(scene, random.Random(i), qtype)
        assert join_existence(question) is question


def test_joined_chains_name_the_joined_option_in_their_reasoning_and_score_perfectly(fixed_scenes):
    for scene, question in existence_questions(fixed_scenes):
        joined = join_existence(question)
        chain = reference_chain(scene, joined)
        reasoning = [s.text for s in chain.steps if s.kind == REASONING]
        assert reasoning[-1] == f"So the answer is {joined.gold_text} {joined.gold_letter}."
        assert f"the {joined.gold_text} is" in reasoning[0]
        plain = reference_chain(scene, question)
        # perception is untouched: only the option's spelling differs
        assert [s.text for s in chain.steps if s.kind != REASONING] == [
            s.text for s in plain.steps if s.kind != REASONING
        ]
        assert chain.answer == plain.answer


@pytest.mark.parametrize("style", [BY_OPTION, BY_OBJECT])
def test_joined_chains_of_every_style_name_the_options_as_the_prompt_writes_them(style, fixed_scenes):
    for scene, question in existence_questions(fixed_scenes):
        joined = join_existence(question)
        plain_steps = reference_chain(scene, question, existence=style).steps
        joined_steps = reference_chain(scene, joined, existence=style).steps
        assert [s.text.replace("-", " ") for s in joined_steps] == [s.text for s in plain_steps]
        said = " ".join(s.text for s in joined_steps if s.kind == REASONING)
        assert any(option in said for option in joined.options)


def test_items_with_joined_options_are_the_same_items_with_other_text():
    plain = list(generate_items(999, 30, hallucination_rate=0.5, joined=False))
    joined = list(generate_items(999, 30, hallucination_rate=0.5, joined=True))
    existence = 0
    for a, b in zip(plain, joined, strict=True):
        assert a.id == b.id and a.scene == b.scene and a.question.gold_letter == b.question.gold_letter
        assert (a.hallucination is None) == (b.hallucination is None)
        if a.question.qtype == "existence":
            existence += 1
            assert len(a.chain.steps) == len(b.chain.steps) and a.chain.answer == b.chain.answer
            for x, y in zip(a.chain.steps, b.chain.steps, strict=True):
                assert (x.kind, x.faithful) == (y.kind, y.faithful)
                assert y.text == x.text if x.kind != REASONING else y.text.replace("-", " ") == x.text
            assert any("-" in y.text for y in b.chain.steps)
        else:
            assert a == b
    assert existence == 6


def test_a_joined_reply_is_scored_against_the_joined_options():
    item = next(i for i in generate_items(999, 10, joined=True) if i.question.qtype == "existence")
    score = score_reply(item, item.chain.text())
    assert score.correct and score.option_text_correct and score.letter_matches_text


@pytest.mark.parametrize("task", [GENERATOR, REGENERATION, SELF_CHECK])
def test_joined_streams_draw_the_same_items_as_plain_ones(task):
    plain = list(itertools.islice(stream(1000, task, joined=False), 12))
    joined = list(itertools.islice(stream(1000, task, joined=True), 12))
    assert [s.scene for s in plain] == [s.scene for s in joined]
    assert [s.text.replace("-", " ") for s in joined] == [s.text.replace("-", " ") for s in plain]
    assert any(token in s.text for s in joined for token in JOINED_TOKENS)
    assert not any(token in s.text for s in plain for token in JOINED_TOKENS)


def test_the_existence_drill_joins_its_options_in_any_style():
    sample = next(existence_stream(900_000, existence=BY_OBJECT, joined=True))
    assert sample.task == EXISTENCE
    options = [line.split()[1] for line in sample.text.splitlines() if line.startswith("- ")]
    assert len(options) == 4 and all(o in JOINED_TOKENS for o in options)


def test_the_tokenizer_corpus_has_no_joined_words():
    """The BPE is trained on two-word options, as when the committed run began: joined ones come as
    added tokens, so the learned vocabulary and every old id stay the same."""
    assert not any(token in text for text in tokenizer_texts(40) for token in JOINED_TOKENS)


def test_there_is_one_joined_token_for_each_colour_and_shape():
    assert len(JOINED_TOKENS) == len(set(JOINED_TOKENS)) == len(COLOURS) * len(SHAPES)


torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def smoke_tokenizer():
    from faithproxy.benchmarks.shapesworld.model.corpus import shapesworld_tokenizer

    return shapesworld_tokenizer(300)


def test_joined_tokens_are_one_token_each_and_decode_to_the_same_text(smoke_tokenizer):
    import copy

    from faithproxy.benchmarks.shapesworld.model.corpus import add_joined_tokens

    tok = copy.deepcopy(smoke_tokenizer)
    before = tok.get_vocab()
    ids = add_joined_tokens(tok)
    assert ids == list(range(len(before), len(before) + len(JOINED_TOKENS)))
    assert {k: v for k, v in tok.get_vocab().items() if k in before} == before  # old ids unchanged
    text = "Which of these is in the image?\n- red-square A\n- blue-circle B\nSo the answer is red-square A."
    encoded = tok(text, add_special_tokens=False)["input_ids"]
    tokens = tok.convert_ids_to_tokens(encoded)
    assert tokens.count("red-square") == 2 and "blue-circle" in tokens
    assert tokens[tokens.index("red-square") + 1] == "\u0120A"  # the letter follows the option's one token
    assert tok.decode(encoded) == text
    plain = "There is a small red square in the centre."
    assert (
        tok(plain, add_special_tokens=False)["input_ids"]
        == smoke_tokenizer(plain, add_special_tokens=False)["input_ids"]
    )


def test_join_vocab_adds_rows_from_the_words_and_keeps_everything_else(smoke_tokenizer):
    import copy

    from faithproxy.benchmarks.shapesworld.model import config as cfg
    from faithproxy.benchmarks.shapesworld.model.joined_vocab import join_vocab

    tok = copy.deepcopy(smoke_tokenizer)
    model = cfg.build_model(tok, cfg.SIZES["smoke"], seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.tensor([[5, 6, 7, 8]])
    model(input_ids=ids).logits.sum().backward()
    optimizer.step()
    before_in = model.get_input_embeddings().weight.detach().clone()
    before_out = model.get_output_embeddings().weight.detach().clone()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    param = model.get_output_embeddings().weight
    new = join_vocab(model, tok, optimizer)
    rows = model.get_input_embeddings().weight
    assert rows.shape[0] % 64 == 0 and rows.shape[0] >= len(tok) == len(smoke_tokenizer) + len(JOINED_TOKENS)
    assert model.get_output_embeddings().weight is param  # the optimizer still holds it
    assert model.config.text_config.vocab_size == rows.shape[0]
    red, square = tok.convert_tokens_to_ids(["\u0120red", "\u0120square"])
    joined = new[JOINED_TOKENS.index("red-square")]
    assert torch.allclose(rows[joined], (before_in[red] + before_in[square]) / 2)
    out = model.get_output_embeddings().weight
    assert torch.allclose(out[joined], (before_out[red] + before_out[square]) / 2)
    old = before_in.shape[0]
    keep = [i for i in range(old) if i not in new]
    assert torch.equal(rows[keep], before_in[keep]) and torch.equal(out[keep], before_out[keep])
    with torch.no_grad():
        after = model(input_ids=ids).logits
    assert torch.equal(after[..., keep], logits[..., keep])  # old inputs read exactly as before
    assert optimizer.state[param]["exp_avg"].shape == out.shape
    model.zero_grad()
    model(input_ids=torch.tensor([[joined, 5]])).logits.sum().backward()
    optimizer.step()  # trains on with the grown matrices
    with pytest.raises(ValueError, match="already has"):
        join_vocab(model, tok, optimizer)


def test_the_existence_lookup_drill_looks_up_joined_existence_options():
    from faithproxy.benchmarks.shapesworld.model.corpus import LOOKUP, LOOKUP_EXISTENCE, drill_seed, lookup_stream

    drill = lookup_stream(drill_seed(0, LOOKUP_EXISTENCE), task=LOOKUP_EXISTENCE, qtypes=("existence",))
    samples = list(itertools.islice(drill, 6))
    assert {s.task for s in samples} == {LOOKUP_EXISTENCE}
    for sample in samples:
        asked = sample.text.rsplit("Look up the letter of: ", 1)[1].rstrip(".").split("; ")
        assert all(a in JOINED_TOKENS for a in asked)
        lines = dict(line[2:].rsplit(" ", 1) for line in sample.text.splitlines() if line.startswith("- "))
        assert sample.target == "Found: " + " ".join(f"{a} {lines[a]}." for a in asked)
    assert next(lookup_stream(drill_seed(0, LOOKUP))).task == LOOKUP
