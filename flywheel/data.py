"""Exported pairs as model inputs: for the project's DPO loop (`encode_rows`) and for TRL (`to_dataset`).

Images are read as the pair carries them: a data URL is decoded, a path is opened; nothing is fetched.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from faithproxy.flywheel.pairs import read_jsonl


def open_image(ref: str) -> Image.Image:
    """A pair's image: a data URL or a file path."""
    if ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        if ";base64" not in header:
            raise ValueError("an image data URL must be base64 encoded")
        return Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB")
    if ref.startswith(("http://", "https://")):
        raise ValueError(f"{ref[:60]}: pairs carry images as data URLs or files; URLs are never fetched")
    return Image.open(Path(ref)).convert("RGB")


def completion_parts(row: dict[str, Any], side: str) -> tuple[str, str]:
    """(chain before the step, the step) of the `side` ("chosen" or "rejected") completion."""
    meta = row.get("metadata") or {}
    if "prefix" in meta and f"{side}_step" in meta:
        return meta["prefix"], meta[f"{side}_step"]
    content = row[side][-1]["content"]
    return "", content if isinstance(content, str) else "".join(p.get("text") or "" for p in content)


@dataclass
class Encoded:
    """Chosen rows first, then rejected rows, right-padded; `step_mask` marks the step's tokens."""

    tensors: dict[str, torch.Tensor]
    step_mask: torch.Tensor


def encode_rows(processor: Any, rows: Sequence[dict[str, Any]]) -> Encoded:
    tok = processor.tokenizer
    prompts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    images = [[open_image(ref) for ref in r["images"]] for r in rows]
    sides = [(r, "chosen") for r in rows] + [(r, "rejected") for r in rows]
    flat = [image for row_images in images for image in row_images]  # the processor takes them in order
    encoded = processor(text=prompts * 2, images=flat * 2, padding=False)
    ids, types, masks = [], [], []
    for i, (row, side) in enumerate(sides):
        prefix, step = completion_parts(row, side)
        completion = tok(prefix + step, add_special_tokens=False, return_offsets_mapping=True)
        in_step = [int(start >= len(prefix) and end > start) for start, end in completion["offset_mapping"]]
        prompt_ids = list(encoded["input_ids"][i])
        ids.append(prompt_ids + list(completion["input_ids"]))
        if "mm_token_type_ids" in encoded:  # Qwen2.5-VL marks the image tokens so
            types.append(list(encoded["mm_token_type_ids"][i]) + [0] * len(completion["input_ids"]))
        masks.append([0] * len(prompt_ids) + in_step)
    width = max(map(len, ids))

    def padded(seqs: list[list[int]], value: int) -> torch.Tensor:
        return torch.tensor([s + [value] * (width - len(s)) for s in seqs], dtype=torch.long)

    tensors = {
        "input_ids": padded(ids, tok.pad_token_id),
        "attention_mask": padded([[1] * len(s) for s in ids], 0),
        **({"mm_token_type_ids": padded(types, 0)} if types else {}),
        # the processor's image tensors (pixel_values, and image_grid_thw for Qwen2.5-VL) as it made them
        **{
            k: torch.as_tensor(v)
            for k, v in encoded.items()
            if k not in ("input_ids", "attention_mask", "mm_token_type_ids")
        },
    }
    return Encoded(tensors, padded(masks, 0).float())


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The pairs of an exported file, image files resolved against the file's folder."""
    rows = list(read_jsonl(path))
    for row in rows:
        row["images"] = [ref if ref.startswith("data:") else str(path.parent / ref) for ref in row["images"]]
    return rows


def to_dataset(path: Path) -> Any:
    """The exported file as a `datasets.Dataset` TRL's vision DPO reads: prompt/chosen/rejected and an
    `images` column of PIL images (the metadata column is left out)."""
    from datasets import Dataset

    rows = load_rows(path)
    return Dataset.from_list(
        [
            {
                "prompt": r["prompt"],
                "chosen": r["chosen"],
                "rejected": r["rejected"],
                "images": [open_image(ref) for ref in r["images"]],
            }
            for r in rows
        ]
    )
