"""Builds and trains the fixture model on CPU: `python -m tinyvlm.train_fixture --out DIR`.

Tokenizer, config and random weights come from code (no downloads); the model is then trained, with a
fixed seed and full-batch AdamW, on every example of `tinyvlm.examples` with the loss on the completion
tokens only (for continuations the partial assistant message is prompt, not target). Training stops
once every target token is the teacher-forced argmax with a logit margin to spare (so that vLLM's
slightly different float arithmetic picks the same tokens) and transformers' greedy `generate`
reproduces every target; then the model directory is written.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tinyvlm import build, hf_reference
from tinyvlm import fixture_spec as spec
from tinyvlm.examples import Example, all_examples
from tinyvlm.tokenizer import fixture_tokenizer

IGNORE = -100
MARGIN = 4.0  # minimum logit gap between each target token and the runner-up before we stop
CHECK_EVERY = 10


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor]
    labels: torch.Tensor  # [batch, seq] next-token targets aligned with logits (IGNORE elsewhere)


def encode(processor, examples: list[Example]) -> Batch:
    """All examples as one right-padded batch; labels mark the completion and its <|im_end|>."""
    tok = processor.tokenizer
    texts = [hf_reference.prompt_text(tok, e.messages) for e in examples]
    images = [spec.load_image(e.fixture) for e in examples]
    prompts = processor(text=texts, images=images, padding=False)
    rows, types, targets = [], [], []
    for i, example in enumerate(examples):
        prompt_ids = list(prompts["input_ids"][i])
        target_ids = tok(example.target + tok.eos_token, add_special_tokens=False)["input_ids"]
        rows.append(prompt_ids + target_ids)
        types.append(list(prompts["mm_token_type_ids"][i]) + [0] * len(target_ids))
        targets.append([IGNORE] * (len(prompt_ids) - 1) + target_ids + [IGNORE])
    width = max(map(len, rows))
    pad = tok.pad_token_id

    def padded(seqs: list[list[int]], value: int) -> torch.Tensor:
        return torch.tensor([s + [value] * (width - len(s)) for s in seqs], dtype=torch.long)

    tensors = {
        "input_ids": padded(rows, pad),
        "attention_mask": padded([[1] * len(r) for r in rows], 0),
        "mm_token_type_ids": padded(types, 0),
        "pixel_values": torch.as_tensor(prompts["pixel_values"]),
        "image_grid_thw": torch.as_tensor(prompts["image_grid_thw"]),
    }
    return Batch(tensors, padded(targets, IGNORE))


def token_stats(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss, whether each example's targets are all argmax, and the smallest margin per example."""
    mask = labels != IGNORE
    safe = labels.clamp(min=0)
    loss = torch.nn.functional.cross_entropy(logits[mask], labels[mask])
    with torch.no_grad():
        target_logit = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        others = logits.scatter(-1, safe.unsqueeze(-1), float("-inf")).amax(-1)
        margin = torch.where(mask, target_logit - others, torch.full_like(target_logit, float("inf")))
        min_margin = margin.amin(-1)
    return loss, min_margin > 0, min_margin


def greedy_mismatches(model, processor, examples: list[Example]) -> list[str]:
    model.eval()
    bad = [e.key for e in examples if hf_reference.greedy_reply(model, processor, e) != e.target]
    model.train()
    return bad


def train(out_dir: Path, seed: int = 0, max_steps: int = 600, lr: float = 3e-3) -> dict:
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    started = time.monotonic()
    tokenizer = fixture_tokenizer()
    processor = build.make_processor(tokenizer)
    model = build.build_model(tokenizer, seed=seed)
    examples = all_examples()
    batch = encode(processor, examples)
    n_targets = int((batch.labels != IGNORE).sum())
    print(f"{len(examples)} examples, {batch.labels.shape[1]} tokens wide, {n_targets} target tokens", flush=True)

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    model.train()
    done, loss_value, step = False, float("nan"), 0
    for step in range(1, max_steps + 1):
        logits = model(**batch.tensors, use_cache=False).logits.float()
        loss, exact, margin = token_stats(logits, batch.labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        loss_value = loss.item()
        if step % CHECK_EVERY == 0 or step == 1:
            print(
                f"step {step:4d} loss {loss_value:.4f} exact {int(exact.sum())}/{len(examples)} "
                f"min margin {margin.min().item():+.2f} ({time.monotonic() - started:.0f}s)",
                flush=True,
            )
        # The margins are from before this step's update; one more step only widens them.
        if step % CHECK_EVERY == 0 and bool(exact.all()) and margin.min().item() >= MARGIN:
            bad = greedy_mismatches(model, processor, examples)
            print(f"greedy check: {len(examples) - len(bad)}/{len(examples)} reproduced {bad[:4]}", flush=True)
            if not bad:
                done = True
                break
    elapsed = time.monotonic() - started
    info = {
        "seed": seed,
        "steps": step,
        "final_loss": loss_value,
        "train_seconds": round(elapsed, 1),
        "examples": len(examples),
        "all_targets_reproduced": done,
    }
    build.save(model.eval(), processor, out_dir, build.fixture_digest(), info)
    print(f"saved {out_dir} after {step} steps, loss {loss_value:.5f}, {elapsed:.0f}s", flush=True)
    return info


def ensure_built(out_dir: Path, seed: int = 0) -> bool:
    """Trains into `out_dir` unless it holds a build with the current digest; True when it trained.

    Builds into a sibling temporary directory and renames it, so a crashed or failed run never leaves
    a half-written model that looks up to date.
    """
    out_dir = Path(out_dir)
    if build.built_digest(out_dir) == build.fixture_digest():
        print(f"fixture model up to date: {out_dir}", flush=True)
        return False
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        info = train(tmp, seed=seed)
        if not info["all_targets_reproduced"]:
            raise RuntimeError(f"training stopped before every fixture target was reproduced: {info}")
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--if-stale", action="store_true", help="skip when --out holds an up-to-date build")
    args = parser.parse_args(argv)
    if args.if_stale:
        ensure_built(args.out, seed=args.seed)
        return 0
    info = train(args.out, seed=args.seed, max_steps=args.max_steps, lr=args.lr)
    return 0 if info["all_targets_reproduced"] else 1


if __name__ == "__main__":
    sys.exit(main())
