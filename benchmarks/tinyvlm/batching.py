"""Chat examples as one right-padded training batch, for both tiny models (fixture and ShapesWorld).

Each row is a rendered prompt followed by its target reply and `<|im_end|>`; the labels are the next
token at every reply position (`IGNORE` elsewhere), so the loss falls on the reply only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

IGNORE = -100  # the label of a position that carries no loss (cross_entropy's ignore_index)


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor]
    labels: torch.Tensor  # [batch, seq] next-token targets aligned with logits (IGNORE elsewhere)


def chat_batch(
    processor: Any,
    prompts: Sequence[str],
    images: Sequence[Any],
    targets: Sequence[str],
    end_tokens: Sequence[str] | None = None,
) -> Batch:
    """One row per (rendered prompt text, its image, target reply); labels mark the reply and its end,
    the tokenizer's end-of-sequence token unless `end_tokens` names each row's (GLM ends with `<|user|>`)."""
    tok = processor.tokenizer
    encoded = processor(text=list(prompts), images=list(images), padding=False)
    rows, types, labels = [], [], []
    for i, target in enumerate(targets):
        prompt_ids = list(encoded["input_ids"][i])
        end = end_tokens[i] if end_tokens is not None else tok.eos_token
        target_ids = tok(target + end, add_special_tokens=False)["input_ids"]
        rows.append(prompt_ids + target_ids)
        types.append(list(encoded["mm_token_type_ids"][i]) + [0] * len(target_ids))
        labels.append([IGNORE] * (len(prompt_ids) - 1) + target_ids + [IGNORE])
    width = max(map(len, rows))

    def padded(seqs: list[list[int]], value: int) -> torch.Tensor:
        return torch.tensor([s + [value] * (width - len(s)) for s in seqs], dtype=torch.long)

    tensors = {
        "input_ids": padded(rows, tok.pad_token_id),
        "attention_mask": padded([[1] * len(r) for r in rows], 0),
        "mm_token_type_ids": padded(types, 0),
        "pixel_values": torch.as_tensor(encoded["pixel_values"]),
        "image_grid_thw": torch.as_tensor(encoded["image_grid_thw"]),
    }
    return Batch(tensors, padded(labels, IGNORE))
