"""Builds and trains the fixture model on CPU: `python -m faithproxy.benchmarks.tinyvlm.train_fixture --out DIR`.

Tokenizer, config and random weights come from code (no downloads); the model is then trained, with a
fixed seed and full-batch AdamW, on every example of `tinyvlm.examples` with the loss on the completion
tokens only (for continuations the partial assistant message is prompt, not target). Training stops
once every target token is the teacher-forced argmax with a logit margin to spare (so that vLLM's
slightly different float arithmetic picks the same tokens) and transformers' greedy `generate`
reproduces every target; then the model directory is written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from faithproxy.benchmarks.tinyvlm import build, hf_reference
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.benchmarks.tinyvlm.batching import IGNORE, Batch, chat_batch
from faithproxy.benchmarks.tinyvlm.examples import Example, all_examples
from faithproxy.benchmarks.tinyvlm.tokenizer import fixture_tokenizer

MARGIN = 4.0  # minimum logit gap between each target token and the runner-up before we stop
CHECK_EVERY = 10
LR = 3e-3
MAX_STEPS = 600
# Bump when a change to the training logic here changes the weights it produces (the digest below
# covers the data, tokenizer, config and hyperparameters, not this module's code).
RECIPE_VERSION = 2


def encode(processor, examples: list[Example]) -> Batch:
    """All examples as one right-padded batch; labels mark the completion and its <|im_end|>."""
    texts = [hf_reference.prompt_text(processor.tokenizer, e.messages) for e in examples]
    images = [spec.load_image(e.fixture) for e in examples]
    return chat_batch(processor, texts, images, [e.target for e in examples])


def bucketed(processor, examples: list[Example], ratio: float = 1.25) -> list[Batch]:
    """The examples as a few batches of similar length (a third of one padded batch was padding)."""
    lengths = encode(processor, examples).tensors["attention_mask"].sum(1).tolist()
    groups: list[list[int]] = []
    for i in sorted(range(len(examples)), key=lambda i: (lengths[i], i)):
        if groups and lengths[i] <= ratio * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [encode(processor, [examples[i] for i in group]) for group in groups]


def token_stats(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed loss, whether each example's targets are all argmax, and the smallest margin per example."""
    mask = labels != IGNORE
    safe = labels.clamp(min=0)
    loss = torch.nn.functional.cross_entropy(logits[mask], labels[mask], reduction="sum")
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


def train(out_dir: Path, seed: int = 0, max_steps: int = MAX_STEPS, lr: float = LR) -> dict:
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    started = time.monotonic()
    tokenizer = fixture_tokenizer()
    processor = build.make_processor(tokenizer)
    model = build.build_model(tokenizer, seed=seed)
    examples = all_examples()
    batches = bucketed(processor, examples)
    n_targets = sum(int((b.labels != IGNORE).sum()) for b in batches)
    widths = "+".join(f"{len(b.labels)}x{b.labels.shape[1]}" for b in batches)
    print(f"{len(examples)} examples in batches {widths}, {n_targets} target tokens", flush=True)

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    model.train()
    done, loss_value, min_margin, step = False, float("nan"), float("nan"), 0
    for step in range(1, max_steps + 1):
        # One full-batch step, the buckets' gradients summed (loss = mean over all target tokens).
        optimizer.zero_grad(set_to_none=True)
        loss_sum, exact_parts, margin_parts = 0.0, [], []
        for batch in batches:
            logits = model(**batch.tensors, use_cache=False).logits.float()
            loss, exact, margin = token_stats(logits, batch.labels)
            (loss / n_targets).backward()
            loss_sum += loss.item()
            exact_parts.append(exact)
            margin_parts.append(margin)
        loss_value = loss_sum / n_targets
        exact, margin = torch.cat(exact_parts), torch.cat(margin_parts)
        min_margin = margin.min().item()
        if step % CHECK_EVERY == 0 or step == 1:
            print(
                f"step {step:4d} loss {loss_value:.4f} exact {int(exact.sum())}/{len(examples)} "
                f"min margin {min_margin:+.2f} ({time.monotonic() - started:.0f}s)",
                flush=True,
            )
        # Checked before the update, so the saved weights are the ones these margins were measured on.
        if step % CHECK_EVERY == 0 and bool(exact.all()) and min_margin >= MARGIN:
            bad = greedy_mismatches(model, processor, examples)
            print(f"greedy check: {len(examples) - len(bad)}/{len(examples)} reproduced {bad[:4]}", flush=True)
            if not bad:
                done = True
                break
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    elapsed = time.monotonic() - started
    info = {
        "seed": seed,
        "steps": step,
        "final_loss": loss_value,
        "min_logit_margin": round(min_margin, 3),
        "train_seconds": round(elapsed, 1),
        "examples": len(examples),
        "all_targets_reproduced": done,
    }
    build.save(model.eval(), processor, out_dir, fixture_digest(seed, max_steps, lr), info)
    print(f"saved {out_dir} after {step} steps, loss {loss_value:.5f}, {elapsed:.0f}s", flush=True)
    return info


def fixture_digest(seed: int = 0, max_steps: int = MAX_STEPS, lr: float = LR) -> str:
    """sha256 of everything the trained weights depend on; a build is reused only when it matches.

    Semantic rather than a hash of source files, so reformatting the code does not force a retrain:
    the examples (prompt texts as rendered by the current prompt builders, targets), the image
    pixels, the trained tokenizer, the model and processor configs, the hyperparameters and versions.
    """
    import tokenizers
    import transformers

    tokenizer = fixture_tokenizer()
    processor = build.make_processor(tokenizer)

    def text_only(messages: list[dict]) -> list:
        return [
            [m["role"], m["content"]]
            if isinstance(m["content"], str)
            else [m["role"], [p.get("text", p["type"]) for p in m["content"]]]
            for m in messages
        ]

    payload = {
        "recipe": RECIPE_VERSION,
        "hyper": {"seed": seed, "max_steps": max_steps, "lr": lr, "margin": MARGIN, "check_every": CHECK_EVERY},
        "examples": [[e.key, e.fixture, text_only(e.messages), e.target] for e in all_examples()],
        "pixels": {f.name: hashlib.sha256(spec.load_image(f.name).tobytes()).hexdigest() for f in spec.FIXTURES},
        "tokenizer": tokenizer.backend_tokenizer.to_str(),
        "chat_template": tokenizer.chat_template,
        "config": build.model_config(tokenizer).to_dict(),
        "image_processor": processor.image_processor.to_dict(),
        "versions": [torch.__version__, transformers.__version__, tokenizers.__version__],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def ensure_built(out_dir: Path, seed: int = 0) -> bool:
    """Trains into `out_dir` unless it holds a build with the current digest; True when it trained.

    Builds into a sibling temporary directory and renames it, so a crashed or failed run never leaves
    a half-written model that looks up to date.
    """
    out_dir = Path(out_dir)
    if build.built_digest(out_dir) == fixture_digest(seed):
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
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--if-stale", action="store_true", help="skip when --out holds an up-to-date build")
    args = parser.parse_args(argv)
    if args.if_stale:
        ensure_built(args.out, seed=args.seed)
        return 0
    info = train(args.out, seed=args.seed, max_steps=args.max_steps, lr=args.lr)
    return 0 if info["all_targets_reproduced"] else 1


if __name__ == "__main__":
    sys.exit(main())
