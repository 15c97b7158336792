"""Greedy generation in transformers for ShapesWorld prompts.

`generate_batch` left-pads a batch for speed (checkpoint evaluation); `generate_one` runs a single
request exactly as `tinyvlm.hf_reference` does, which is what vLLM's output is compared with.
Special tokens are dropped from the text, as vLLM drops them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from faithproxy.benchmarks.shapesworld.model.corpus import user_message
from faithproxy.benchmarks.tinyvlm.hf_reference import prompt_text


@torch.inference_mode()
def generate_batch(
    model: Any, processor: Any, texts: Sequence[str], images: Sequence[Image.Image], max_new_tokens: int = 160
) -> list[str]:
    tok = processor.tokenizer
    prompts = [prompt_text(tok, [user_message(t)]) for t in texts]
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        inputs = processor(text=prompts, images=list(images), padding=True, return_tensors="pt")
    finally:
        tok.padding_side = side
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[:, inputs["input_ids"].shape[1] :]
    return tok.batch_decode(new, skip_special_tokens=True)


@torch.inference_mode()
def generate_one(model: Any, processor: Any, text: str, image: Image.Image, max_new_tokens: int = 160) -> str:
    prompt = prompt_text(processor.tokenizer, [user_message(text)])
    inputs = processor(text=[prompt], images=[image], return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def generate_in_batches(
    model: Any,
    processor: Any,
    texts: Sequence[str],
    images: Sequence[Image.Image],
    batch_size: int = 25,
    max_new_tokens: int = 160,
) -> list[str]:
    replies: list[str] = []
    for i in range(0, len(texts), batch_size):
        replies += generate_batch(
            model, processor, texts[i : i + batch_size], images[i : i + batch_size], max_new_tokens
        )
    return replies
