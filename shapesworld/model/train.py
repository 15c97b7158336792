"""Trains the ShapesWorld model from scratch on CPU, checkpoints it, and picks the final one.

    python -m shapesworld.model.train --out var/sw-train --minutes 70 --seed 0
    python -m shapesworld.model.train --out var/sw-smoke --smoke          # CI: well under 2 minutes

Everything is seeded: the tokenizer's corpus, the initial weights, and the data stream (task of each
step from a fixed cycle, samples from `corpus.stream`), so the weights after step S are a function of
(seed, size, S) and `--max-steps S` reproduces a checkpoint (`training_info.json` records its step).
The learning rate depends on the step only; `--minutes` bounds the run's wall time, so how many steps
a run gets depends on the machine, not what a given step computes.

Every `--checkpoint-minutes` of training (or `--checkpoint-steps`), the model is saved to
OUT/checkpoints/step-NNNNNN and evaluated with greedy decoding in transformers on a fixed held-out set
(seed `corpus.HELDOUT_SEED`, never a training seed): perception error rate against ground truth,
accuracy per question type, regeneration and self-check success. OUT/eval.json holds every result.
At the end OUT/final is a copy of the chosen checkpoint: among those whose perception error rate is
in the target band, the one with the highest worst-type accuracy (see `choose`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from detectors.self_check_prompt import parse_self_check
from regenerators.prompts import parse_bracketed
from shapesworld.claims import check_sentence
from shapesworld.model import config as cfg
from shapesworld.model.corpus import (
    GENERATOR,
    HELDOUT_SEED,
    REGENERATION,
    SELF_CHECK,
    TASKS,
    Sample,
    shapesworld_tokenizer,
    stream,
    task_seed,
    user_message,
)
from shapesworld.model.greedy import generate_in_batches
from shapesworld.model.scoring import heldout_items, summarise
from shapesworld.scenes import render
from tinyvlm import build
from tinyvlm.hf_reference import prompt_text
from tinyvlm.train_fixture import IGNORE, Batch

BAND = (0.05, 0.30)  # the target perception error rate
# The task of each step, cycled: 70% generator, 15% regeneration, 15% self-check. One task per
# batch keeps padding low (regeneration prompts are about 1.5x as long as the others).
CYCLE = "GGRGGSGGGRGGSGGRGGSG"
_TASK_OF = {"G": GENERATOR, "R": REGENERATION, "S": SELF_CHECK}


@dataclass(frozen=True)
class RunConfig:
    size: str = "full"
    batch_size: int = 16
    lr: float = 1.5e-3
    warmup_steps: int = 200
    decay_from: int = 1000  # lr falls as 1/sqrt(step) from here on
    weight_decay: float = 0.01
    heldout: int = 150  # held-out chains per evaluation (a multiple of 5: equal per question type)
    heldout_aux: int = 40  # held-out regeneration and self-check examples per evaluation
    tokenizer_items: int = 3000
    max_new_tokens: int = 160


SMOKE = RunConfig(size="smoke", batch_size=4, heldout=5, heldout_aux=4, tokenizer_items=300, max_new_tokens=24)


def learning_rate(step: int, run: RunConfig) -> float:
    warm = min(1.0, step / run.warmup_steps)
    return run.lr * warm * min(1.0, math.sqrt(run.decay_from / max(step, 1)))


def encode(processor: Any, samples: Sequence[Sample]) -> Batch:
    """Samples as one right-padded batch; labels mark the reply and its end-of-message token."""
    tok = processor.tokenizer
    texts = [prompt_text(tok, [user_message(s.text)]) for s in samples]
    prompts = processor(text=texts, images=[s.image() for s in samples], padding=False)
    rows, types, targets = [], [], []
    for i, sample in enumerate(samples):
        prompt_ids = list(prompts["input_ids"][i])
        target_ids = tok(sample.target + tok.eos_token, add_special_tokens=False)["input_ids"]
        rows.append(prompt_ids + target_ids)
        types.append(list(prompts["mm_token_type_ids"][i]) + [0] * len(target_ids))
        targets.append([IGNORE] * (len(prompt_ids) - 1) + target_ids + [IGNORE])
    width = max(map(len, rows))

    def padded(seqs: list[list[int]], value: int) -> torch.Tensor:
        return torch.tensor([s + [value] * (width - len(s)) for s in seqs], dtype=torch.long)

    tensors = {
        "input_ids": padded(rows, tok.pad_token_id),
        "attention_mask": padded([[1] * len(r) for r in rows], 0),
        "mm_token_type_ids": padded(types, 0),
        "pixel_values": torch.as_tensor(prompts["pixel_values"]),
        "image_grid_thw": torch.as_tensor(prompts["image_grid_thw"]),
    }
    return Batch(tensors, padded(targets, IGNORE))


# --- evaluation ----------------------------------------------------------------------------------


class HeldOut:
    """The fixed held-out set: chains for every question type, and auxiliary-task examples."""

    def __init__(self, run: RunConfig) -> None:
        self.items = heldout_items(run.heldout)
        self.aux = {task: _take(stream(HELDOUT_SEED, task), run.heldout_aux) for task in (REGENERATION, SELF_CHECK)}
        self.max_new_tokens = run.max_new_tokens

    @torch.no_grad()
    def evaluate(self, model: Any, processor: Any) -> dict[str, Any]:
        started = time.monotonic()
        was_training = model.training
        model.eval()
        try:
            replies = generate_in_batches(
                model,
                processor,
                [i.question.prompt for i in self.items],
                [render(i.scene) for i in self.items],
                max_new_tokens=self.max_new_tokens,
            )
            result = summarise(self.items, replies).to_dict()
            regen = self.aux[REGENERATION]
            replies = generate_in_batches(
                model, processor, [s.text for s in regen], [s.image() for s in regen], max_new_tokens=40
            )
            result["regeneration_correct"] = _ratio(
                sum(_regeneration_ok(s, r) for s, r in zip(regen, replies, strict=True)), len(regen)
            )
            checks = self.aux[SELF_CHECK]
            replies = generate_in_batches(
                model, processor, [s.text for s in checks], [s.image() for s in checks], max_new_tokens=4
            )
            result["self_check_accuracy"] = _ratio(
                sum(parse_self_check(r) == (s.target == "FAITHFUL") for s, r in zip(checks, replies, strict=True)),
                len(checks),
            )
        finally:
            model.train(was_training)
        result["eval_seconds"] = round(time.monotonic() - started, 1)
        return result


def _regeneration_ok(sample: Sample, reply: str) -> bool:
    """The bracketed sentence is a true perception sentence about the scene."""
    sentence = parse_bracketed(reply)
    return sentence is not None and check_sentence(sentence, sample.scene.objects).faithful is True


def _take(iterator: Any, n: int) -> list[Any]:
    return [next(iterator) for _ in range(n)]


def _ratio(a: int, b: int) -> float:
    return round(a / b, 4) if b else 0.0


def choose(entries: Sequence[dict[str, Any]], band: tuple[float, float] = BAND) -> dict[str, Any] | None:
    """The checkpoint to keep: in the band, the highest worst-type accuracy (then the lower error
    rate); with none in the band, the one nearest to it. None only when there are no entries."""
    if not entries:
        return None
    inside = [e for e in entries if band[0] <= e["heldout"]["perception_error_rate"] <= band[1]]
    if inside:
        return max(
            inside,
            key=lambda e: (
                e["heldout"]["min_accuracy"],
                e["heldout"]["accuracy"],
                -e["heldout"]["perception_error_rate"],
            ),
        )

    def distance(e: dict[str, Any]) -> float:
        rate = e["heldout"]["perception_error_rate"] if e["heldout"]["perception_steps"] else 1.0
        return max(band[0] - rate, rate - band[1])

    return min(entries, key=lambda e: (distance(e), -e["heldout"]["min_accuracy"]))


# --- training ------------------------------------------------------------------------------------

DIGEST_SOURCES = (
    "shapesworld/world.py",
    "shapesworld/scenes.py",
    "shapesworld/language.py",
    "shapesworld/questions.py",
    "shapesworld/perturb.py",
    "shapesworld/chains.py",
    "shapesworld/examples.py",
    "shapesworld/dataset.py",
    "shapesworld/model/corpus.py",
    "shapesworld/model/config.py",
    "shapesworld/model/train.py",
    "tinyvlm/tokenizer.py",
    "tinyvlm/build.py",
    "regenerators/prompts.py",
    "detectors/self_check_prompt.py",
)


def source_digest() -> str:
    """sha256 over what the training data and model depend on, and the library versions."""
    import tokenizers
    import transformers

    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256(f"torch={torch.__version__} transformers={transformers.__version__}".encode())
    h.update(f" tokenizers={tokenizers.__version__}".encode())
    for rel in DIGEST_SOURCES:
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return h.hexdigest()


def train(
    out: Path,
    run: RunConfig,
    seed: int,
    minutes: float,
    max_steps: int | None,
    checkpoint_minutes: float,
    checkpoint_steps: int | None,
    command: str,
) -> dict[str, Any]:
    torch.set_num_threads(2)
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = shapesworld_tokenizer(run.tokenizer_items)
    processor = build.make_processor(tokenizer)
    size = cfg.SIZES[run.size]
    model = cfg.build_model(tokenizer, size, seed)
    n_params = cfg.count_parameters(model)
    heldout = HeldOut(run)
    streams = {task: stream(task_seed(seed, task), task) for task in TASKS}
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, betas=(0.9, 0.98), weight_decay=run.weight_decay)
    digest = source_digest()
    report: dict[str, Any] = {
        "command": command,
        "seed": seed,
        "run": run.__dict__,
        "size": size.to_dict(),
        "parameters": n_params,
        "band": list(BAND),
        "checkpoints": [],
    }
    print(f"{n_params:,} parameters, vocab {len(tokenizer)}, setup {time.monotonic() - started:.0f}s", flush=True)

    model.train()
    samples, train_seconds, since_checkpoint, step = 0, 0.0, 0.0, 0
    losses: dict[str, list[float]] = {t: [] for t in TASKS}
    while True:
        step += 1
        tick = time.monotonic()
        task = _TASK_OF[CYCLE[(step - 1) % len(CYCLE)]]
        batch = encode(processor, _take(streams[task], run.batch_size))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, run)
        logits = model(**batch.tensors, use_cache=False).logits
        mask = batch.labels != IGNORE
        loss = torch.nn.functional.cross_entropy(logits[mask].float(), batch.labels[mask])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        samples += run.batch_size
        spent = time.monotonic() - tick
        train_seconds += spent
        since_checkpoint += spent
        losses[task].append(loss.item())
        if step % 50 == 0 or step == 1:
            mean = {t: round(sum(v) / len(v), 4) for t, v in losses.items() if v}
            print(
                f"step {step} samples {samples} loss {mean} lr {learning_rate(step, run):.2e} "
                f"{samples / train_seconds:.1f} samples/s wall {time.monotonic() - started:.0f}s",
                flush=True,
            )
            losses = {t: [] for t in TASKS}
        out_of_time = time.monotonic() - started >= minutes * 60 or (max_steps is not None and step >= max_steps)
        due = since_checkpoint >= checkpoint_minutes * 60 or (checkpoint_steps and step % checkpoint_steps == 0)
        if due or out_of_time:
            since_checkpoint = 0.0
            info = {"seed": seed, "step": step, "samples": samples, "train_seconds": round(train_seconds, 1)}
            entry = _checkpoint(out, model, processor, digest, info | {"parameters": n_params, "size": run.size})
            entry["heldout"] = heldout.evaluate(model, processor)
            report["checkpoints"].append(entry)
            print(f"checkpoint {entry['name']}: {json.dumps(entry['heldout'])}", flush=True)
            _write_json(out / "eval.json", report)
        if out_of_time:
            break

    chosen = choose(report["checkpoints"])
    assert chosen is not None
    final = out / "final"
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(out / "checkpoints" / chosen["name"], final)
    info = json.loads((final / "training_info.json").read_text())
    info |= {"heldout_transformers": chosen["heldout"], "command": command, "heldout_seed": HELDOUT_SEED}
    _write_json(final / "training_info.json", info)
    report["chosen"] = chosen["name"]
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    _write_json(out / "eval.json", report)
    print(f"final = {chosen['name']} ({json.dumps(chosen['heldout'])})", flush=True)
    return report


def _checkpoint(out: Path, model: Any, processor: Any, digest: str, info: dict[str, Any]) -> dict[str, Any]:
    name = f"step-{info['step']:06d}"
    path = out / "checkpoints" / name
    shutil.rmtree(path, ignore_errors=True)
    model.eval()
    build.save(model, processor, path, digest, info)
    model.train()
    return {"name": name, **info}


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=70.0, help="wall-time budget of the training loop")
    parser.add_argument("--max-steps", type=int, help="stop after this step (reproduces a checkpoint)")
    parser.add_argument("--checkpoint-minutes", type=float, default=10.0, help="training time between checkpoints")
    parser.add_argument("--checkpoint-steps", type=int, help="also checkpoint every this many steps")
    parser.add_argument("--smoke", action="store_true", help="tiny model, tiny steps: for CI")
    args = parser.parse_args(argv)
    command = "python -m shapesworld.model.train " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.smoke:
        report = train(
            args.out, SMOKE, args.seed, args.minutes, args.max_steps or 6, 1e9, args.checkpoint_steps or 3, command
        )
    else:
        report = train(
            args.out,
            RunConfig(),
            args.seed,
            args.minutes,
            args.max_steps,
            args.checkpoint_minutes,
            args.checkpoint_steps,
            command,
        )
    return 0 if report.get("chosen") else 1


if __name__ == "__main__":
    sys.exit(main())
