"""DPO written out: the loss, the log-probabilities it compares, and a small training loop.

The loss is DPO's (Rafailov et al., 2023) with the sigmoid link, TRL's default `loss_type="sigmoid"`:

    margin = (log π(chosen) − log π_ref(chosen)) − (log π(rejected) − log π_ref(rejected))
    loss   = −log σ(β · margin)

log π(·) sums the token log-probabilities of the corrected step alone (the chain before it is context in
both completions, and would cancel in the margin anyway). The reference model is the starting weights:
its log-probabilities are computed once, before the first step, so only one model is held in memory.
`sft` is the comparison the issue asks for: the same data and steps, plain likelihood of the chosen step.

The loop runs on the CPU with the repo's tiny Qwen2.5-VL models in minutes; `faithproxy train dpo`
(flywheel/train_cli.py) is its command. For a real model on a GPU, docs/flywheel.md shows TRL's
DPOTrainer on the same exported file.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from faithproxy.flywheel.data import Encoded, encode_rows


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss, chosen rewards, rejected rewards); rewards are β · (log π − log π_ref) per pair."""
    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    loss = -F.logsigmoid(beta * (chosen_ratio - rejected_ratio))
    return loss.mean(), beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def step_logps(model: Any, enc: Encoded) -> torch.Tensor:
    """Per row, the summed log-probability of the tokens `enc.step_mask` marks (the step's tokens), on
    the model's device."""
    device = next(model.parameters()).device
    tensors = {k: v.to(device) for k, v in enc.tensors.items()}
    logits = model(**tensors).logits[:, :-1].float()
    targets = tensors["input_ids"][:, 1:]
    mask = enc.step_mask[:, 1:].to(device)
    token_logps = torch.gather(F.log_softmax(logits, dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)
    return (token_logps * mask).sum(dim=1)


@dataclass(frozen=True)
class TrainConfig:
    """`objective`: "dpo" or "sft". `steps` caps the optimizer steps (0: `epochs` full passes)."""

    objective: str = "dpo"
    beta: float = 0.1
    lr: float = 2e-5
    batch_size: int = 8
    epochs: int = 3
    steps: int = 0
    seed: int = 0
    checkpoint_every: int = 0  # optimizer steps between checkpoints (0: only the final model)
    log_every: int = 10


def _batches(n: int, size: int, rng: random.Random) -> list[list[int]]:
    order = list(range(n))
    rng.shuffle(order)
    return [order[i : i + size] for i in range(0, n, size)]


@torch.no_grad()
def reference_logps(model: Any, processor: Any, rows: Sequence[dict[str, Any]], batch_size: int) -> torch.Tensor:
    """[pair, 2]: the starting model's log-probabilities of (chosen, rejected) steps."""
    model.eval()
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        enc = encode_rows(processor, chunk)
        logps = step_logps(model, enc)
        out.append(torch.stack(logps.chunk(2), dim=1))
    model.train()
    return torch.cat(out)


def evaluate_pairs(
    model: Any, processor: Any, rows: Sequence[dict[str, Any]], ref: torch.Tensor, config: TrainConfig
) -> dict[str, float]:
    """Held-out pairs: DPO loss, how often the chosen step's reward beats the rejected one's, the margin."""
    if not rows:
        return {}
    now = reference_logps(model, processor, rows, config.batch_size)
    loss, chosen, rejected = dpo_loss(now[:, 0], now[:, 1], ref[:, 0], ref[:, 1], config.beta)
    return {
        "loss": round(float(loss), 5),
        "reward_accuracy": round(float((chosen > rejected).float().mean()), 4),
        "reward_margin": round(float((chosen - rejected).mean()), 5),
        "chosen_logp": round(float(now[:, 0].mean()), 4),
        "rejected_logp": round(float(now[:, 1].mean()), 4),
    }


def train(
    model: Any,
    processor: Any,
    rows: Sequence[dict[str, Any]],
    config: TrainConfig,
    out: Path,
    *,
    heldout: Sequence[dict[str, Any]] = (),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Tunes `model` on the pairs `rows`; saves checkpoints and the final model under `out`; returns the
    summary (also written to `out/summary.json`)."""
    if not rows:
        raise ValueError("no pairs to train on")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    started = time.monotonic()
    ref = reference_logps(model, processor, rows, config.batch_size).detach()
    ref_heldout = reference_logps(model, processor, heldout, config.batch_size) if heldout else None
    before = evaluate_pairs(model, processor, heldout, ref_heldout, config) if ref_heldout is not None else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    per_epoch = math.ceil(len(rows) / config.batch_size)
    total = config.steps or per_epoch * config.epochs
    step, history, checkpoints = 0, [], []
    model.train()
    while step < total:
        for batch in _batches(len(rows), config.batch_size, rng):
            if step >= total:
                break
            enc = encode_rows(processor, [rows[i] for i in batch])
            logps = step_logps(model, enc)
            chosen, rejected = logps.chunk(2)
            if config.objective == "dpo":
                loss, rc, rr = dpo_loss(chosen, rejected, ref[batch, 0], ref[batch, 1], config.beta)
                accuracy = float((rc > rr).float().mean())
            else:  # sft: the chosen step's likelihood, per token
                loss = -chosen.sum() / enc.step_mask[: len(batch), 1:].sum().clamp(min=1).to(chosen.device)
                accuracy = float(((chosen - ref[batch, 0]) > (rejected - ref[batch, 1])).float().mean())
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            record = {"step": step, "loss": round(float(loss.detach()), 5), "reward_accuracy": round(accuracy, 4)}
            history.append(record)
            if step % config.log_every == 0 or step == total:
                elapsed = time.monotonic() - started
                log(f"step {step}/{total}  loss {record['loss']:.4f}  reward acc {accuracy:.2f}  {elapsed:.0f}s")
            if config.checkpoint_every and step % config.checkpoint_every == 0 and step < total:
                checkpoints.append(str(save_model(model, processor, out / "checkpoints" / f"step-{step:05d}", {})))
    after = evaluate_pairs(model, processor, heldout, ref_heldout, config) if ref_heldout is not None else {}
    summary = {
        "config": asdict(config),
        "pairs": len(rows),
        "heldout_pairs": len(heldout),
        "optimizer_steps": step,
        "wall_s": round(time.monotonic() - started, 1),
        "final_loss_mean_last_10": round(sum(r["loss"] for r in history[-10:]) / len(history[-10:]), 5),
        "heldout_before": before,
        "heldout_after": after,
        "checkpoints": checkpoints,
        "history": history,
    }
    save_model(model, processor, out / "model", {k: v for k, v in summary.items() if k != "history"})
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def save_model(model: Any, processor: Any, path: Path, info: dict[str, Any]) -> Path:
    """A model folder that transformers and vLLM load (as tinyvlm.build.save writes one)."""
    path.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    (path / "training_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    model.train()
    return path
