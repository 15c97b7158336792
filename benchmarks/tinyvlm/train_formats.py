"""Builds the tiny format models: `python -m faithproxy.benchmarks.tinyvlm.train_formats --out DIR [--if-stale]`.

One tiny Qwen2.5-VL (the fixture's size and recipe: benchmarks/tinyvlm/build.py,
benchmarks/tinyvlm/train_fixture.py) trained on CPU on every example of `tinyvlm.formats_spec`, then
written once per family into DIR/<family> with that family's chat template (Qwen3-VL-Thinking,
GLM-4.1V-Thinking, Qwen2.5-VL). The tokenizer is the fixture's plus GLM's role tokens and markers, which
fit in the same embedding rows.

Training stops once every target token is the teacher-forced argmax with a logit margin to spare and
transformers' greedy `generate` reproduces every target (so that vLLM's float arithmetic picks the same
tokens); a build is reused while its digest (examples as rendered, pixels, tokenizer, templates, config,
hyperparameters, versions) matches.
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
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer
from transformers import GenerationConfig, PreTrainedTokenizerFast

from faithproxy.benchmarks.tinyvlm import build
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.benchmarks.tinyvlm import formats_spec as fs
from faithproxy.benchmarks.tinyvlm.batching import IGNORE, Batch, chat_batch
from faithproxy.benchmarks.tinyvlm.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, fixture_tokenizer
from faithproxy.benchmarks.tinyvlm.train_fixture import CHECK_EVERY, LR, MARGIN, MAX_STEPS, token_stats

# GLM's prompt and role tokens (special: never in the output text) and the markers the families write
# (ordinary tokens: they stay in the text, where the reasoning parsers look for them).
GLM_SPECIAL_TOKENS = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>"]
MARKER_TOKENS = ["<answer>", "</answer>", "<tool_call>", "</tool_call>"]
RECIPE_VERSION = 1


def formats_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer.from_str(fixture_tokenizer().backend_tokenizer.to_str())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GLM_SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=SPECIAL_TOKENS[3:] + GLM_SPECIAL_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    """The fixture's greedy defaults, with GLM's `<|user|>` among the end-of-sequence tokens."""
    config = build.generation_config(tokenizer)
    config.eos_token_id = [*config.eos_token_id, tokenizer.convert_tokens_to_ids("<|user|>")]
    return config


IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"  # vLLM's for Qwen2.5-VL images


def vllm_messages(messages: list[dict[str, Any]], content_format: str = "openai") -> list[dict[str, Any]]:
    """The messages as vLLM hands them to a chat template (renderers/chat_utils.py).

    "openai": every content is a list of parts, an image part `{"type": "image"}`; "string": the texts
    joined by newlines, after one image placeholder per image.
    """
    out = []
    for m in messages:
        content = m["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if content_format == "openai":
            content = [{"type": "image"} if p.get("type") == "image_url" else p for p in parts]
        else:
            images = [IMAGE_PLACEHOLDER for p in parts if p.get("type") == "image_url"]
            texts = [p["text"] for p in parts if p.get("type") == "text"]
            content = "\n".join([*images, "\n".join(texts)] if texts else images)
        out.append({**m, "content": content})
    return out


def render(tokenizer: Any, template: str, messages: list[dict[str, Any]], content_format: str = "openai") -> str:
    """The prompt text vLLM renders: a generation prompt, or the final assistant message continued."""
    continuing = messages[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        vllm_messages(messages, content_format),
        chat_template=template,
        tokenize=False,
        add_generation_prompt=not continuing,
        continue_final_message=continuing,
    )


def encode(processor: Any, examples: list[fs.FormatExample]) -> Batch:
    texts = [render(processor.tokenizer, e.template, e.messages, e.content_format) for e in examples]
    images = [spec.load_image(e.fixture) for e in examples]
    return chat_batch(processor, texts, images, [e.target for e in examples], [e.end_token for e in examples])


def bucketed(processor: Any, examples: list[fs.FormatExample], ratio: float = 1.25) -> list[Batch]:
    """The examples as a few batches of similar length (regeneration prompts are three times as long)."""
    lengths = encode(processor, examples).tensors["attention_mask"].sum(1).tolist()
    groups: list[list[int]] = []
    for i in sorted(range(len(examples)), key=lambda i: (lengths[i], i)):
        if groups and lengths[i] <= ratio * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [encode(processor, [examples[i] for i in group]) for group in groups]


@torch.inference_mode()
def greedy(model: Any, processor: Any, prompt: str, fixture: str, max_new_tokens: int = 160) -> str:
    """transformers' greedy completion of a rendered prompt with a fixture image (special tokens dropped)."""
    inputs = processor(text=[prompt], images=[spec.load_image(fixture)], return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def greedy_mismatches(model: Any, processor: Any, examples: list[fs.FormatExample]) -> list[str]:
    model.eval()
    bad = [
        e.key
        for e in examples
        if greedy(model, processor, render(processor.tokenizer, e.template, e.messages, e.content_format), e.fixture)
        != e.target
    ]
    model.train()
    return bad


def train(out_dir: Path, seed: int = 0, max_steps: int = MAX_STEPS, lr: float = LR) -> dict[str, Any]:
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    started = time.monotonic()
    tokenizer = formats_tokenizer()
    processor = build.make_processor(tokenizer)
    model = build.build_model(tokenizer, seed=seed)
    model.generation_config = generation_config(tokenizer)
    examples = fs.all_examples()
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
        exact = torch.cat(exact_parts)
        loss_value, min_margin = loss_sum / n_targets, torch.cat(margin_parts).min().item()
        if step % CHECK_EVERY == 0 or step == 1:
            print(
                f"step {step:4d} loss {loss_value:.4f} exact {int(exact.sum())}/{len(examples)} "
                f"min margin {min_margin:+.2f} ({time.monotonic() - started:.0f}s)",
                flush=True,
            )
        if step % CHECK_EVERY == 0 and bool(exact.all()) and min_margin >= MARGIN:
            bad = greedy_mismatches(model, processor, examples)
            print(f"greedy check: {len(examples) - len(bad)}/{len(examples)} reproduced {bad[:4]}", flush=True)
            if not bad:
                done = True
                break
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    info = {
        "seed": seed,
        "steps": step,
        "final_loss": loss_value,
        "min_logit_margin": round(min_margin, 3),
        "train_seconds": round(time.monotonic() - started, 1),
        "examples": len(examples),
        "all_targets_reproduced": done,
    }
    digest = formats_digest(seed, max_steps, lr)
    model = model.eval()
    for family in fs.FAMILIES.values():
        processor.chat_template = processor.tokenizer.chat_template = family.template
        build.save(model, processor, out_dir / family.name, digest, {**info, "family": family.name})
    print(f"saved {out_dir} after {step} steps, loss {loss_value:.5f}", flush=True)
    return info


def formats_digest(seed: int = 0, max_steps: int = MAX_STEPS, lr: float = LR) -> str:
    """sha256 of everything the trained weights and the written directories depend on."""
    import tokenizers
    import transformers

    tokenizer = formats_tokenizer()
    processor = build.make_processor(tokenizer)

    payload = {
        "recipe": RECIPE_VERSION,
        "hyper": {"seed": seed, "max_steps": max_steps, "lr": lr, "margin": MARGIN, "check_every": CHECK_EVERY},
        "examples": [
            [e.key, e.fixture, render(tokenizer, e.template, e.messages, e.content_format), e.target, e.end_token]
            for e in fs.all_examples()
        ],
        "families": [
            [f.name, f.template, f.parser, f.reasoning_format, f.end_token, f.content_format]
            for f in fs.FAMILIES.values()
        ],
        "pixels": {f.name: hashlib.sha256(spec.load_image(f.name).tobytes()).hexdigest() for f in spec.FIXTURES},
        "tokenizer": tokenizer.backend_tokenizer.to_str(),
        "config": build.model_config(tokenizer).to_dict(),
        "generation": generation_config(tokenizer).to_dict(),
        "image_processor": processor.image_processor.to_dict(),
        "versions": [torch.__version__, transformers.__version__, tokenizers.__version__],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def model_dir(out_dir: Path, family: str) -> Path:
    """Where the model directory of `family` (a key of formats_spec.FAMILIES) is written."""
    return Path(out_dir) / fs.FAMILIES[family].name


def is_built(out_dir: Path, seed: int = 0) -> bool:
    digest = formats_digest(seed)
    return all(build.built_digest(model_dir(out_dir, f)) == digest for f in fs.FAMILIES)


def ensure_built(out_dir: Path, seed: int = 0) -> bool:
    """Trains into `out_dir` unless it holds a build with the current digest; True when it trained.
    Builds beside it and renames, so a failed run never leaves a half-written build that looks current."""
    out_dir = Path(out_dir)
    if is_built(out_dir, seed):
        print(f"format models up to date: {out_dir}", flush=True)
        return False
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        info = train(tmp, seed=seed)
        if not info["all_targets_reproduced"]:
            raise RuntimeError(f"training stopped before every format target was reproduced: {info}")
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--if-stale", action="store_true", help="skip when --out holds an up-to-date build")
    args = parser.parse_args(argv)
    if args.if_stale:
        ensure_built(args.out, seed=args.seed)
        return 0
    info = train(args.out, seed=args.seed)
    return 0 if info["all_targets_reproduced"] else 1


if __name__ == "__main__":
    sys.exit(main())
