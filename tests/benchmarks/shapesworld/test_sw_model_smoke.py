"""The training script's smoke configuration runs end to end, and a step is reproducible."""

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from faithproxy.benchmarks.shapesworld.model.corpus import JOINED_TOKENS  # noqa: E402 -- after the import skips

REPO = Path(__file__).resolve().parents[3]


def run_train(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "faithproxy.benchmarks.shapesworld.model.train", "--out", str(out), "--smoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sw-smoke")
    run_train(out, "--seed", "0")
    return out


def test_smoke_run_checkpoints_evaluates_and_keeps_a_final_model(smoke_run: Path):
    report = json.loads((smoke_run / "eval.json").read_text())
    assert [c["name"] for c in report["checkpoints"]] == ["step-000003", "step-000006"]
    for entry in report["checkpoints"]:
        heldout = entry["heldout"]
        assert heldout["n_chains"] == 5
        assert set(heldout["accuracy_by_type"]) == {"count", "attribute", "existence", "spatial", "comparison"}
        assert {"perception_error_rate", "min_accuracy", "regeneration_correct", "self_check_accuracy"} <= set(heldout)
    assert report["chosen"] in {"step-000003", "step-000006"}
    final = smoke_run / "final"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "processor_config.json", "chat_template.jinja"):
        assert (final / name).is_file(), name
    info = json.loads((final / "training_info.json").read_text())
    assert info["seed"] == 0 and "heldout_transformers" in info and info["size"] == "smoke"


def test_final_model_loads_and_generates_in_transformers(smoke_run: Path):
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from faithproxy.benchmarks.shapesworld.model.greedy import generate_one
    from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items
    from faithproxy.benchmarks.shapesworld.scenes import render

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(smoke_run / "final", dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(smoke_run / "final")
    item = heldout_items(1)[0]
    reply = generate_one(model, processor, item.question.prompt, render(item.scene), max_new_tokens=8)
    assert isinstance(reply, str)


def test_max_steps_reproduces_a_checkpoint(smoke_run: Path, tmp_path: Path):
    run_train(tmp_path, "--seed", "0", "--max-steps", "3")
    name = "checkpoints/step-000003/model.safetensors"
    assert (tmp_path / name).read_bytes() == (smoke_run / name).read_bytes()


def test_resuming_a_checkpoint_continues_the_same_run(smoke_run: Path, tmp_path: Path):
    run_train(tmp_path, "--seed", "0", "--resume", str(smoke_run / "checkpoints/step-000003"), "--max-steps", "6")
    name = "checkpoints/step-000006/model.safetensors"
    assert (tmp_path / name).read_bytes() == (smoke_run / name).read_bytes()
    assert not (smoke_run / "final" / "trainer_state.pt").exists()


def test_reply_before_marks_each_rows_reply_up_to_the_token():
    import torch

    from faithproxy.benchmarks.shapesworld.model.train import IGNORE, reply_before

    i = IGNORE
    labels = torch.tensor([[i, i, 5, 6, 9, 7, 9, i], [i, 5, 6, 7, 8, i, i, i], [i, i, i, 9, 4, i, i, i]])
    o, x = False, True
    assert reply_before(labels, 9).tolist() == [
        [o, o, x, x, o, o, o, o],  # up to the first 9 only
        [o, o, o, o, o, o, o, o],  # no 9: nothing marked
        [o, o, o, o, o, o, o, o],  # the reply starts with 9
    ]


def test_token_weights_of_the_existence_drill_count_only_the_reasoning():
    """An E sample's perception sentences weigh 0, its reasoning 1 and its letters the letter weight;
    the same chain as a G sample weighs every token."""
    from faithproxy.benchmarks.shapesworld.chains import BY_OBJECT
    from faithproxy.benchmarks.shapesworld.model.corpus import EXISTENCE, drill_seed, existence_stream

    sample = next(existence_stream(drill_seed(0, EXISTENCE), existence=BY_OBJECT))
    w = drill_weights(EXISTENCE, sample)
    assert w.reply.startswith("<think>") and " is an option." in w.reply  # a by-object existence chain
    assert w.weights[: w.first_so].eq(0).all() and w.weights[w.first_so :].gt(0).all()
    assert w.weights[w.is_letter].eq(3.0).all() and w.is_letter[w.first_so :].sum() >= 3  # "option X", answer, repeat
    assert w.as_generator.gt(0).all()


@dataclasses.dataclass
class DrillWeights:
    reply: str
    weights: Any  # torch tensors, one entry per learned token
    is_letter: Any
    first_so: int
    as_generator: Any  # the same sample's weights as a G sample


def drill_weights(task: str, sample: Any) -> DrillWeights:
    """`token_weights` of one sample as `task` and as a G sample (letter weight 3, smoke tokenizer)."""
    import torch

    from faithproxy.benchmarks.shapesworld.model.corpus import GENERATOR, shapesworld_tokenizer
    from faithproxy.benchmarks.shapesworld.model.train import SMOKE, encode, option_letter_ids, token_weights
    from faithproxy.benchmarks.tinyvlm import build

    tokenizer = shapesworld_tokenizer(SMOKE.tokenizer_items)
    labels = encode(build.make_processor(tokenizer), [sample]).labels
    letters = torch.tensor(option_letter_ids(tokenizer))
    so_id = tokenizer.convert_tokens_to_ids("\u0120So")
    run = dataclasses.replace(SMOKE, letter_weight=3.0)
    learned = labels[labels != -100].tolist()
    return DrillWeights(
        reply=tokenizer.decode(learned),
        weights=token_weights(task, 1, run, labels, letters, so_id),
        is_letter=torch.isin(torch.tensor(learned), letters),
        first_so=learned.index(so_id),
        as_generator=token_weights(GENERATOR, 1, run, labels, letters, so_id),
    )


def test_the_reasoning_drill_weighs_the_reasoning_of_reference_chains_of_every_type():
    """A W sample is the G chain of its item (same text, same reply), drawn from every question
    type; its perception sentences weigh 0, everything from the first "So" on counts."""
    from faithproxy.benchmarks.shapesworld.dataset import generate_items
    from faithproxy.benchmarks.shapesworld.model.corpus import REASONING, drill_seed, generator_sample, reasoning_stream
    from faithproxy.benchmarks.shapesworld.questions import QTYPES

    samples = list(itertools.islice(reasoning_stream(drill_seed(0, REASONING)), 40))
    assert {s.task for s in samples} == {REASONING}
    items = list(generate_items(drill_seed(0, REASONING), 40, hallucination_rate=0.0))
    references = [generator_sample(item) for item in items]
    assert [(s.text, s.target) for s in samples] == [(r.text, r.target) for r in references]
    assert {i.question.qtype for i in items} == set(QTYPES)
    assert samples == list(itertools.islice(reasoning_stream(drill_seed(0, REASONING)), 40))  # seeded
    w = drill_weights(REASONING, samples[0])
    assert w.first_so > 5 and w.weights[: w.first_so].eq(0).all() and w.weights[w.first_so :].gt(0).all()
    assert w.weights[w.is_letter].eq(3.0).all() and w.is_letter.any()
    assert w.as_generator.gt(0).all()


def test_perception_weight_changes_only_the_chain_steps_after_its_step(tmp_path: Path):
    """Cycle GON: step 1 a chain (G), 2 the lookup drill (O), 3 the answer drill (N), 4 a chain. With
    the chains' perception sentences weighed 0.3 after step 2, the first three steps are the same as
    without, and step 4 is not."""
    cycle = ("--seed", "0", "--max-steps", "4", "--cycle", "0:GON")
    run_train(tmp_path / "plain", *cycle)
    run_train(tmp_path / "weighed", *cycle, "--perception-weight", "0.3", "--perception-weight-from", "2")
    step = "checkpoints/step-{:06d}/model.safetensors".format
    assert (tmp_path / "plain" / step(3)).read_bytes() == (tmp_path / "weighed" / step(3)).read_bytes()
    assert (tmp_path / "plain" / step(4)).read_bytes() != (tmp_path / "weighed" / step(4)).read_bytes()
    report = json.loads((tmp_path / "weighed" / "eval.json").read_text())
    assert "--perception-weight 0.3" in report["command"]


def test_a_reasoning_drill_cycle_trains_after_its_step_and_resumes(tmp_path: Path):
    """`--cycle 2:W`: steps 1-2 are the plain run's chains, steps 3-4 the reasoning drill; a run
    resumed at step 3 reaches step 4's weights byte for byte."""
    cycle = ("--seed", "0", "--max-steps", "4", "--checkpoint-steps", "1", "--cycle", "0:G")
    run_train(tmp_path / "plain", *cycle)
    run_train(tmp_path / "drilled", *cycle, "--cycle", "2:W")
    step = "checkpoints/step-{:06d}/model.safetensors".format
    assert (tmp_path / "plain" / step(2)).read_bytes() == (tmp_path / "drilled" / step(2)).read_bytes()
    assert (tmp_path / "plain" / step(3)).read_bytes() != (tmp_path / "drilled" / step(3)).read_bytes()
    out = tmp_path / "resumed"
    run_train(out, *cycle, "--cycle", "2:W", "--resume", str((tmp_path / "drilled" / step(3)).parent))
    assert (out / step(4)).read_bytes() == (tmp_path / "drilled" / step(4)).read_bytes()


def test_grown_layers_start_as_the_identity_and_the_cache_still_fits(tmp_path: Path):
    """A model grown from 1 to 3 layers computes the same logits as before, keeps its KV-cache
    indices in order, saves and reloads with 3 layers, and generates the same greedy tokens."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from faithproxy.benchmarks.shapesworld.model import config as cfg
    from faithproxy.benchmarks.shapesworld.model.corpus import shapesworld_tokenizer
    from faithproxy.benchmarks.shapesworld.model.grow import grow

    tokenizer = shapesworld_tokenizer(300)
    model = cfg.build_model(tokenizer, cfg.SIZES["smoke"], seed=0).eval()
    ids = torch.tensor([tokenizer.encode("There is a small red circle in the centre.")])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        fresh = grow(model, (0, 2), seed=1)
        after = model(input_ids=ids).logits
    assert torch.equal(before, after)
    assert len(fresh) > 0 and any(p.abs().sum() > 0 for p in fresh)  # not all zero: they can learn
    layers = model.model.language_model.layers
    assert [layer.self_attn.layer_idx for layer in layers] == [0, 1, 2]
    assert model.config.text_config.num_hidden_layers == 3
    model.save_pretrained(tmp_path)
    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert len(loaded.model.language_model.layers) == 3
    with torch.no_grad():
        out_a = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
        out_b = loaded.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(out_a, out_b)


def test_grow_rejects_positions_outside_the_grown_stack():
    from faithproxy.benchmarks.shapesworld.model import config as cfg
    from faithproxy.benchmarks.shapesworld.model.corpus import shapesworld_tokenizer
    from faithproxy.benchmarks.shapesworld.model.grow import grow, grown_positions

    model = cfg.build_model(shapesworld_tokenizer(300), cfg.SIZES["smoke"], seed=0)
    with pytest.raises(ValueError, match="distinct indices below 2"):
        grow(model, (2,), seed=0)
    with pytest.raises(ValueError, match="distinct"):
        grow(model, (0, 0), seed=0)
    assert len(model.model.language_model.layers) == 1  # a refused growth changes nothing
    assert grown_positions("2,5") == (2, 5)
    with pytest.raises(ValueError):
        grown_positions("2;5")


def test_growing_mid_run_trains_on_and_resumes_across_the_growth(tmp_path: Path):
    """--grow 2:1 adds a layer after step 2. Step 2 is the same as without growth; a run resumed
    from step 2 (before the growth) and one resumed from step 3 (after it) both reach step 4's
    weights byte for byte."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    grown = ("--seed", "0", "--max-steps", "4", "--checkpoint-steps", "1", "--grow", "2:1")
    run_train(tmp_path / "plain", "--seed", "0", "--max-steps", "2", "--checkpoint-steps", "1")
    result = run_train(tmp_path / "grown", *grown)
    assert "grew to 2 layers" in result.stdout
    step = "checkpoints/step-{:06d}".format
    weights = step(2) + "/model.safetensors"
    assert (tmp_path / "plain" / weights).read_bytes() == (tmp_path / "grown" / weights).read_bytes()
    load = Qwen2_5_VLForConditionalGeneration.from_pretrained
    layers = [len(load(tmp_path / "grown" / step(s)).model.language_model.layers) for s in (2, 3)]
    assert layers == [1, 2]
    for resume in (2, 3):
        out = tmp_path / f"resumed-{resume}"
        run_train(out, *grown, "--resume", str(tmp_path / "grown" / step(resume)))
        want = (tmp_path / "grown" / step(4) / "model.safetensors").read_bytes()
        assert (out / step(4) / "model.safetensors").read_bytes() == want
    state = torch.load(tmp_path / "grown" / step(4) / "trainer_state.pt", weights_only=True)
    assert len(state["optimizer"]["param_groups"]) == 2  # the new layer's parameters are a group of their own


@pytest.mark.parametrize(
    "flags",
    [
        ("--spell-out-from", "2"),
        ("--by-object-from", "2"),
        ("--joined-from", "2"),
        ("--joined-from", "2", "--by-object-from", "2"),
    ],
)
def test_an_existence_switch_changes_only_the_chains_after_its_step_and_resumes_across_it(tmp_path: Path, flags):
    """Cycle GNE: step 3 is the existence drill (E), all existence questions. With the switch at step
    2, steps 1-2 are as without; step 3 is not; runs resumed before, at and after the switch reach
    step 4's weights byte for byte."""
    cycle = ("--seed", "0", "--max-steps", "4", "--checkpoint-steps", "1", "--cycle", "0:GNE")
    run_train(tmp_path / "plain", *cycle)
    result = run_train(tmp_path / "switched", *cycle, *flags)
    step = "checkpoints/step-{:06d}/model.safetensors".format
    assert (tmp_path / "plain" / step(2)).read_bytes() == (tmp_path / "switched" / step(2)).read_bytes()
    assert (tmp_path / "plain" / step(3)).read_bytes() != (tmp_path / "switched" / step(3)).read_bytes()
    want = (tmp_path / "switched" / step(4)).read_bytes()
    for resume in (1, 2, 3):
        out = tmp_path / f"resumed-{resume}"
        checkpoint = (tmp_path / "switched" / step(resume)).parent
        run_train(out, *cycle, *flags, "--resume", str(checkpoint))
        assert (out / step(4)).read_bytes() == want
    if "--joined-from" in flags:
        assert "joined existence options" in result.stdout
        saved = json.loads((tmp_path / "switched" / step(3)).with_name("tokenizer.json").read_text())
        before = json.loads((tmp_path / "switched" / step(2)).with_name("tokenizer.json").read_text())
        assert {t["content"] for t in saved["added_tokens"]} - {t["content"] for t in before["added_tokens"]} == set(
            JOINED_TOKENS
        )


def test_the_two_existence_switches_exclude_each_other(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faithproxy.benchmarks.shapesworld.model.train",
            "--out",
            str(tmp_path / "run"),
            "--smoke",
        ]
        + ["--spell-out-from", "1", "--by-object-from", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr
    assert not (tmp_path / "run").exists()
