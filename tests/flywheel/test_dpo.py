"""The DPO loss against its formula, exported pairs through TRL's vision DPO collator, and the project's
loop on the committed ShapesWorld model (CPU, a few steps)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")

from faithproxy.flywheel.data import encode_rows, to_dataset  # noqa: E402
from faithproxy.flywheel.dpo import TrainConfig, dpo_loss, step_logps, train  # noqa: E402
from faithproxy.flywheel.pairs import TRAIN, pair_row, write_jsonl  # noqa: E402
from faithproxy.flywheel.records import Recorded, RecordedStep  # noqa: E402
from faithproxy.shapesworld.model import WEIGHTS_DIR  # noqa: E402
from faithproxy.shapesworld.model.evaluate import data_url  # noqa: E402
from faithproxy.shapesworld.model.scoring import heldout_items  # noqa: E402


def test_the_loss_is_dpos_sigmoid_formula() -> None:
    """−log σ(β((π_c − ref_c) − (π_r − ref_r))), worked by hand for two pairs, as TRL's loss_type="sigmoid"."""
    loss, chosen, rejected = dpo_loss(
        torch.tensor([-1.0, -3.0]),
        torch.tensor([-2.0, -1.0]),
        torch.tensor([-1.5, -2.0]),
        torch.tensor([-1.5, -2.0]),
        0.1,
    )
    # pair 1: margin (−1 + 1.5) − (−2 + 1.5) = 1.0; pair 2: (−3 + 2) − (−1 + 2) = −2.0
    expected = (math.log1p(math.exp(-0.1)) + math.log1p(math.exp(0.2))) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert chosen.tolist() == pytest.approx([0.05, -0.1]) and rejected.tolist() == pytest.approx([-0.05, 0.1])


def _rows(n: int) -> list[dict[str, Any]]:
    """Pairs as the exporter writes them, on ShapesWorld scenes: a true count against a wrong one."""
    rows = []
    for item in heldout_items(n, 997):
        count = len(item.scene.objects)
        good, bad = f"There are {count} objects in the image.", f"There are {count + 1} objects in the image."
        step = RecordedStep(index=0, channel="content", kind="perception", text=good, original_text=bad,
                            verdict="faithful", detected="unfaithful", attempts=1)  # fmt: skip
        recorded = Recorded(request_id=item.id, model="shapesworld-vlm", detector="judge", judge="learned",
                            question=item.question.prompt, image_hashes=("x",), steps=(step,), source="trace",
                            texts={"content": "<think>\n" + good})  # fmt: skip
        rows.append(pair_row(recorded, step, [data_url(item.scene)], TRAIN))
    return rows


@pytest.fixture(scope="module")
def model_and_processor() -> tuple[Any, Any]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(WEIGHTS_DIR, dtype=torch.float32)
    return model, AutoProcessor.from_pretrained(WEIGHTS_DIR)


def test_an_exported_file_loads_into_trls_vision_collator(tmp_path: Path, model_and_processor: Any) -> None:
    _, processor = model_and_processor
    path = tmp_path / "pairs.jsonl"
    write_jsonl(path, _rows(2))
    dataset = to_dataset(path)
    assert dataset.column_names == ["prompt", "chosen", "rejected", "images"]
    batch = trl_dpo.DataCollatorForVisionPreference(processor)([dataset[0], dataset[1]])
    assert batch["input_ids"].shape[0] == 4 and batch["pixel_values"].shape[0] > 0  # chosen rows, then rejected
    assert batch["image_grid_thw"].shape[0] == 4 and bool((batch["completion_mask"].sum(dim=1) > 0).all())
    rejected = processor.tokenizer.decode(batch["input_ids"][2][batch["completion_mask"][2].bool()])
    assert "<think>\nThere are" in rejected and rejected.rstrip().endswith("objects in the image.<|im_end|>")


def test_the_step_mask_covers_the_step_alone(model_and_processor: Any) -> None:
    _, processor = model_and_processor
    row = _rows(1)[0]
    enc = encode_rows(processor, [row])
    for i, side in enumerate(("chosen_step", "rejected_step")):
        marked = enc.tensors["input_ids"][i][enc.step_mask[i].bool()]
        assert processor.tokenizer.decode(marked).strip() == row["metadata"][side]


def test_dpo_steps_move_the_preference_and_save_a_model(tmp_path: Path, model_and_processor: Any) -> None:
    model, processor = model_and_processor
    rows = _rows(2)
    config = TrainConfig(objective="dpo", lr=2e-3, batch_size=2, steps=3, beta=0.5, log_every=2)
    summary = train(model, processor, rows, config, tmp_path / "run", heldout=rows, log=lambda _: None)
    assert summary["optimizer_steps"] == 3
    assert summary["heldout_after"]["reward_margin"] > summary["heldout_before"]["reward_margin"] == 0.0
    saved = json.loads((tmp_path / "run" / "model" / "training_info.json").read_text())
    assert saved["optimizer_steps"] == 3 and (tmp_path / "run" / "model" / "model.safetensors").is_file()
    with torch.no_grad():
        chosen, rejected = step_logps(model, encode_rows(processor, rows)).chunk(2)
    assert bool((chosen > rejected).all())  # the tuned model prefers the true count on these scenes
