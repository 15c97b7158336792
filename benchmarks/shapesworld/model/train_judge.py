"""Trains the learned ShapesWorld judge: the generator's weights, fine-tuned on faithproxy's judge calls.

    python -m faithproxy.benchmarks.shapesworld.model.train_judge --out var/sw-judge --minutes 60 --threads 2
    python -m faithproxy.benchmarks.shapesworld.model.train_judge --out var/sw-judge-smoke --smoke   # CI: seconds

Why start from the generator: it already reads ShapesWorld images (its vision tower and the words for
what it sees took hours of CPU to learn), and a judge that shares its generator's eyes is what a
deployment often has (the same family, a size up). Its perception is imperfect in the same places, so
the judge is good but not an oracle, which is the point (issue 21). The generator's weights are not
changed; the judge is a separate folder (`JUDGE_WEIGHTS_DIR`) with a tokenizer of its own: the
generator's, plus `judge_corpus.JUDGE_TOKENS` as added tokens (rows initialised to the mean of their
BPE pieces' rows, as `joined_vocab` does).

Every `--checkpoint-minutes` the model is saved and scored on judge calls about validation scenes
(`corpus.VALIDATION_SEED`; never the held-out scenes the benchmark uses): the share of replies the
detector's parser reads, and the unfaithful class's precision, recall and F1 (a call is a positive when
its checked sentences hold a false one; a true positive names that sentence). OUT/final is the
checkpoint with the best validation F1. Seeded: the same flags give the same weights.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from faithproxy.benchmarks.shapesworld.claims import check_chain
from faithproxy.benchmarks.shapesworld.dataset import generate_items
from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
from faithproxy.benchmarks.shapesworld.model.corpus import VALIDATION_SEED, Sample
from faithproxy.benchmarks.shapesworld.model.judge_corpus import (
    HALLUCINATION_RATE,
    JUDGE_TOKENS,
    judge_messages,
    judge_sample,
    judge_samples,
    judge_seed,
    judge_stream,
)
from faithproxy.benchmarks.tinyvlm import build
from faithproxy.benchmarks.tinyvlm.batching import IGNORE, Batch, chat_batch
from faithproxy.benchmarks.tinyvlm.digest import file_sha256
from faithproxy.benchmarks.tinyvlm.hf_reference import prompt_text
from faithproxy.detectors.judge_prompt import parse_judge_prompt_details, parse_judge_reply
from faithproxy.faithcore.errors import DetectorError

JUDGE_WEIGHTS_DIR = Path(__file__).resolve().parent / "judge_weights"
MAX_REPLY_TOKENS = 96
JUDGE_LABEL = "shapesworld-judge"  # what build.save writes as the folder's label


def load_start(init: Path, smoke: bool, seed: int) -> tuple[Any, Any]:
    """(model, processor) to fine-tune: the generator's, with the judge's tokens added."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    if smoke:  # a fresh tiny model on the generator's tokenizer: learns nothing, runs in seconds
        from faithproxy.benchmarks.shapesworld.model.config import SIZES, build_model

        tokenizer = AutoTokenizer.from_pretrained(init)
        model = build_model(tokenizer, SIZES["smoke"], seed)
    else:
        tokenizer = AutoTokenizer.from_pretrained(init)
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(init, dtype=torch.float32)
    add_judge_tokens(model, tokenizer)
    return model, build.make_processor(tokenizer)


def add_judge_tokens(model: Any, tokenizer: Any) -> list[int]:
    """Adds JUDGE_TOKENS to the tokenizer and rows for them to both embedding matrices; nothing when
    the tokenizer has them (a judge checkpoint to continue from)."""
    if all(token in tokenizer.get_vocab() for token in JUDGE_TOKENS):
        return tokenizer.convert_tokens_to_ids(list(JUDGE_TOKENS))
    pieces = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in JUDGE_TOKENS]
    tokenizer.add_tokens(list(JUDGE_TOKENS))
    ids = tokenizer.convert_tokens_to_ids(list(JUDGE_TOKENS))
    rows = build.vocab_rows(len(tokenizer))
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    for param in (inputs.weight, outputs.weight):
        with torch.no_grad():
            grown = torch.zeros(max(rows, param.shape[0]), param.shape[1], dtype=param.dtype)
            grown[: param.shape[0]] = param
            for token_id, piece in zip(ids, pieces, strict=True):
                grown[token_id] = param[piece].mean(0)
        param.data = grown
    inputs.num_embeddings = outputs.out_features = inputs.weight.shape[0]
    model.config.text_config.vocab_size = inputs.weight.shape[0]
    return ids


def encode(processor: Any, samples: Sequence[Sample]) -> Batch:
    texts = [prompt_text(processor.tokenizer, judge_messages(s)) for s in samples]
    return chat_batch(processor, texts, [s.image() for s in samples], [s.target for s in samples])


# --- validation ----------------------------------------------------------------------------------


def validation_samples(count: int, twins: float = 0.0) -> list[Sample]:
    """`count` judge calls about validation scenes (seeded), drawn as in training (twins included)."""
    rng = random.Random("shapesworld-judge-validation")
    if not twins:  # the first judge's validation set, draw for draw
        items = generate_items(VALIDATION_SEED, count, hallucination_rate=HALLUCINATION_RATE)
        return [judge_sample(item, rng) for item in items]
    samples: list[Sample] = []
    for item in generate_items(VALIDATION_SEED, count, hallucination_rate=HALLUCINATION_RATE):
        samples += judge_samples(item, rng, twins)
    return samples[:count]


def truth_of(sample: Sample) -> int | None:
    """0-based index of the first false sentence among those the call checks (None: all true)."""
    prompt = parse_judge_prompt_details(sample.text)
    checks = check_chain(prompt.sentences, sample.scene.objects).sentences
    return next((k for k in range(prompt.already_checked, len(checks)) if checks[k].faithful is False), None)


def score_replies(samples: Sequence[Sample], replies: Sequence[str]) -> dict[str, Any]:
    tp = fp = fn = tn = unparsed = 0
    for sample, reply in zip(samples, replies, strict=True):
        truth = truth_of(sample)
        prompt = parse_judge_prompt_details(sample.text)
        try:
            said = parse_judge_reply(reply, prompt.sentences).first_unfaithful
        except DetectorError:
            unparsed += 1
            said = None  # an unreadable reply flags nothing (the detector would let the steps through)
        if truth is None:
            fp += said is not None
            tn += said is None
        else:
            tp += said == truth
            fn += said != truth  # a wrong sentence named misses the right one
            fp += said is not None and said != truth
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "calls": len(samples),
        "parsed": round(1 - unparsed / len(samples), 4),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(f1, 4),
    }  # fmt: skip


@torch.inference_mode()
def judge_replies(model: Any, processor: Any, samples: Sequence[Sample], batch_size: int = 25) -> list[str]:
    tok = processor.tokenizer
    replies: list[str] = []
    side, tok.padding_side = tok.padding_side, "left"
    try:
        for i in range(0, len(samples), batch_size):
            part = samples[i : i + batch_size]
            texts = [prompt_text(tok, judge_messages(s)) for s in part]
            inputs = processor(text=texts, images=[s.image() for s in part], padding=True, return_tensors="pt")
            out = model.generate(**inputs, max_new_tokens=MAX_REPLY_TOKENS, do_sample=False)
            replies += tok.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tok.padding_side = side
    return replies


def evaluate(model: Any, processor: Any, samples: Sequence[Sample]) -> dict[str, Any]:
    started = time.monotonic()
    model.eval()
    try:
        result = score_replies(samples, judge_replies(model, processor, samples))
    finally:
        model.train()
    return result | {"eval_seconds": round(time.monotonic() - started, 1)}


# --- training ------------------------------------------------------------------------------------


def verdict_weights(labels: torch.Tensor, tokenizer: Any, weight: float) -> torch.Tensor:
    """Loss weight of each learned token (the labels that are not IGNORE, in order): the verdict
    (FAITHFUL / UNFAITHFUL) and the number of the first unfaithful sentence weigh `weight`, the rest 1.
    Those two tokens are what the detector acts on, and one of thirty in a reply: at equal weight the
    format (typing lines, field names) dominates the loss long after it is learned."""
    verdicts = torch.tensor(tokenizer.convert_tokens_to_ids(["FAITHFUL", "UNFAITHFUL"]))
    field = tokenizer.convert_tokens_to_ids("[First unfaithful sentence]:")
    marked = torch.isin(labels, verdicts)
    at = (labels == field).nonzero()
    for row, col in at.tolist():  # "[First unfaithful sentence]:", " ", then the number
        if col + 2 < labels.shape[1]:
            marked[row, col + 2] = True
    weights = torch.where(marked, weight, 1.0)
    return weights[labels != IGNORE]


def init_info(init: Path) -> dict[str, Any]:
    """What the run started from: the weights' sha256 and, for a judge checkpoint, how it was trained
    (so a judge fine-tuned from an earlier judge still says how to rebuild the whole line)."""
    weights = init / "model.safetensors"
    info: dict[str, Any] = {"path": str(init)}
    if weights.exists():
        info["sha256"] = file_sha256(weights)
    label = init / "fixture_digest.txt"  # build.save writes the label there: "shapesworld-judge" for a judge
    if label.exists() and label.read_text().strip() == JUDGE_LABEL:
        info["training_info"] = json.loads((init / "training_info.json").read_text())
    return info


def learning_rate(step: int, lr: float, warmup: int) -> float:
    return lr * min(1.0, step / warmup)


def train(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.monotonic()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model, processor = load_start(args.init, args.smoke, args.seed)
    validation = validation_samples(args.validation, args.twins)
    stream = judge_stream(judge_seed(args.seed), args.twins)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    report: dict[str, Any] = {"command": " ".join(sys.argv), "init": str(args.init), "checkpoints": []}
    report["init_info"] = init_info(args.init)
    if args.eval_start:
        report["start"] = evaluate(model, processor, validation)
        print(f"start: {json.dumps(report['start'])}", flush=True)
    model.train()
    step, since, losses = 0, 0.0, []
    while True:
        step += 1
        tick = time.monotonic()
        batch = encode(processor, [next(stream) for _ in range(args.batch_size)])
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.lr, args.warmup)
        logits = model(**batch.tensors, use_cache=False).logits
        mask = batch.labels != IGNORE
        token_loss = torch.nn.functional.cross_entropy(logits[mask].float(), batch.labels[mask], reduction="none")
        weights = verdict_weights(batch.labels, processor.tokenizer, args.verdict_weight)
        loss = (token_loss * weights).sum() / weights.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        since += time.monotonic() - tick
        if step % 50 == 0:
            mean = sum(losses) / len(losses)
            print(f"step {step} loss {mean:.4f} wall {time.monotonic() - started:.0f}s", flush=True)
            losses = []
        done = time.monotonic() - started >= args.minutes * 60 or (args.max_steps and step >= args.max_steps)
        if since >= args.checkpoint_minutes * 60 or done:
            since = 0.0
            name = f"step-{step:06d}"
            model.eval()
            info = {"step": step, "samples": step * args.batch_size, "seed": args.seed, "init": str(args.init)}
            info |= {"twins": args.twins, "init_info": report["init_info"]}
            build.save(model, processor, out / "checkpoints" / name, JUDGE_LABEL, info)
            entry = {"name": name, "step": step, "validation": evaluate(model, processor, validation)}
            report["checkpoints"].append(entry)
            print(f"checkpoint {name}: {json.dumps(entry['validation'])}", flush=True)
            (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
        if done:
            break
    best = max(report["checkpoints"], key=lambda e: (e["validation"]["f1"], e["step"]))
    final = out / "final"
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(out / "checkpoints" / best["name"], final)
    info = json.loads((final / "training_info.json").read_text())
    info |= {"validation": best["validation"], "command": report["command"], "validation_seed": VALIDATION_SEED}
    (final / "training_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    report["chosen"] = best["name"]
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"final = {best['name']} ({json.dumps(best['validation'])})", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.shapesworld.model.train_judge", description=__doc__
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--init",
        type=Path,
        default=WEIGHTS_DIR,
        help="weights to start from: the generator's, or a judge checkpoint to continue (with another --seed)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--checkpoint-minutes", type=float, default=10.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument(
        "--twins",
        type=float,
        default=0.0,
        help="share of error-aimed calls followed by their faithful twin (judge_corpus.judge_samples); "
        "0 replays the first judge's stream",
    )
    parser.add_argument("--verdict-weight", type=float, default=1.0, help="loss weight of the verdict and its number")
    parser.add_argument("--validation", type=int, default=200, help="validation calls per checkpoint")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-start", action="store_true", help="also score the starting weights")
    parser.add_argument("--smoke", action="store_true", help="a fresh tiny model and a few steps: for CI")
    args = parser.parse_args(argv)
    if args.smoke:
        args.max_steps = args.max_steps or 3
        args.validation = min(args.validation, 4)
        args.batch_size = min(args.batch_size, 2)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
