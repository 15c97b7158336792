"""The DPO loss against its formula and against TRL's DPOTrainer, exported pairs through TRL's vision DPO
collator, and the project's loop on the committed ShapesWorld model (CPU, a few steps)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")

from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR  # noqa: E402
from faithproxy.benchmarks.shapesworld.model.evaluate import data_url  # noqa: E402
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items  # noqa: E402
from faithproxy.flywheel.data import encode_rows, to_dataset  # noqa: E402
from faithproxy.flywheel.dpo import TrainConfig, dpo_loss, step_logps, train  # noqa: E402
from faithproxy.flywheel.pairs import TRAIN, pair_row, write_jsonl  # noqa: E402
from faithproxy.flywheel.records import Recorded, RecordedStep  # noqa: E402


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


class TrlLoss:
    """TRL's own DPO loss (`DPOTrainer._compute_loss`, TRL 1.16 has no separate loss function) on given
    log-probabilities. The method is called on an object holding what it reads of a trainer: the loss
    settings of a real `DPOConfig`, reference log-probabilities given with the batch (TRL's
    `precompute_ref_log_probs` path), and an accelerator of one process. Its model is a stand-in whose
    per-token log-probabilities are one token per sequence, so each sequence's sum is the value given.
    (Building a DPOTrainer would need a model, a processor and a dataset only to reach the same lines.)"""

    def __init__(self, beta: float) -> None:
        args = trl_dpo.DPOConfig(output_dir="unused", beta=beta, report_to=[], bf16=False, use_cpu=True)
        assert args.loss_type == ["sigmoid"] and args.f_divergence_type == "reverse_kl"  # TRL's plain DPO
        self.args = args
        self.beta = args.beta
        self.loss_types = args.loss_type
        self.loss_weights = args.loss_weights or [1.0] * len(args.loss_type)
        self.ld_alpha = args.ld_alpha
        self.f_divergence_type = args.f_divergence_type
        self.f_alpha_divergence_coef = args.f_alpha_divergence_coef
        self.label_smoothing = args.label_smoothing
        self.use_weighting = args.use_weighting
        self.precompute_ref_logps = True
        self.aux_loss_enabled = False
        self.model = torch.nn.Module().eval()
        self.accelerator = SimpleNamespace(device=torch.device("cpu"), gather=_same, gather_for_metrics=_same)
        self._metrics: dict[str, Any] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._total_train_tokens = 0
        self._tp_size = 1

    def __call__(
        self, policy_chosen: Any, policy_rejected: Any, ref_chosen: Any, ref_rejected: Any
    ) -> tuple[float, dict[str, list[float]]]:
        """TRL's loss and the metrics it logged (rewards among them)."""
        logps = torch.cat([policy_chosen, policy_rejected])  # TRL's batch: the chosen rows, then the rejected

        def model(**_: Any) -> SimpleNamespace:
            zeros = torch.zeros_like(logps)[:, None]
            return SimpleNamespace(log_probs=logps[:, None], entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())

        rows = len(logps)
        inputs = {
            "input_ids": torch.zeros(rows, 2, dtype=torch.long),
            "attention_mask": torch.ones(rows, 2, dtype=torch.long),
            "completion_mask": torch.tensor([[0, 1]] * rows),  # the prompt token, then one completion token
            "ref_chosen_logps": ref_chosen,
            "ref_rejected_logps": ref_rejected,
        }
        loss = trl_dpo.DPOTrainer._compute_loss(self, model, inputs, return_outputs=False)
        return float(loss), dict(self._metrics["eval"])


def _same(tensor: Any) -> Any:
    return tensor


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_the_loss_equals_trls_dpo_trainer_loss(beta: float) -> None:
    """The project's loss and TRL's sigmoid DPO on the same log-probabilities (32 pairs, margins of both
    signs, some far in the tails) agree to 1e-6, and so do the mean rewards TRL logs."""
    g = torch.Generator().manual_seed(51)
    policy_chosen, policy_rejected, ref_chosen, ref_rejected = (-30 * torch.rand(32, generator=g) for _ in range(4))
    ours, chosen, rejected = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
    theirs, metrics = TrlLoss(beta)(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    assert abs(float(ours) - theirs) <= 1e-6
    assert abs(float(chosen.mean()) - metrics["rewards/chosen"][0]) <= 1e-6
    assert abs(float(rejected.mean()) - metrics["rewards/rejected"][0]) <= 1e-6
    assert float(ours) > 0.1  # not two zeros agreeing


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
