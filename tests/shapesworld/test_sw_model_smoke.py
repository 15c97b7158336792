"""The training script's smoke configuration runs end to end, and a step is reproducible."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]


def run_train(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "shapesworld.model.train", "--out", str(out), "--smoke", *args],
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

    from shapesworld.model.greedy import generate_one
    from shapesworld.model.scoring import heldout_items
    from shapesworld.scenes import render

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

    from shapesworld.model.train import IGNORE, reply_before

    i = IGNORE
    labels = torch.tensor([[i, i, 5, 6, 9, 7, 9, i], [i, 5, 6, 7, 8, i, i, i], [i, i, i, 9, 4, i, i, i]])
    o, x = False, True
    assert reply_before(labels, 9).tolist() == [
        [o, o, x, x, o, o, o, o],  # up to the first 9 only
        [o, o, o, o, o, o, o, o],  # no 9: nothing marked
        [o, o, o, o, o, o, o, o],  # the reply starts with 9
    ]


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
