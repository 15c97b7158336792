"""Tiny Qwen2.5-VL models built from code with random weights: the fixture model and ShapesWorld's.

One config for both, told apart by a `ModelSize`. Sizes must suit vLLM's CPU backend: the text head_dim
must be one its attention kernel accepts (32, 64, 80, ...) and `mrope_section` must sum to head_dim / 2.
The vision window (112 px) covers a whole image of either model, so window and full attention see the
same tokens. The fixture's size: text head_dim 128 / 4 heads = 32, mrope_section [4, 6, 6], 2 vision blocks.
The image processor keeps the 112×112 fixture images as they are (16 image tokens each) and shrinks
anything bigger to at most 224×224 pixels (64 tokens).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
)

from faithproxy.benchmarks.tinyvlm.tokenizer import CHAT_TEMPLATE

MIN_PIXELS = 56 * 56
MAX_PIXELS = 224 * 224
DIGEST_FILE = "fixture_digest.txt"


@dataclass(frozen=True)
class ModelSize:
    """The sizes that tell one tiny Qwen2.5-VL from another; everything else in the config is shared."""

    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_intermediate: int
    mrope_section: tuple[int, int, int]
    vision_hidden: int
    vision_depth: int
    vision_heads: int
    vision_intermediate: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FIXTURE_SIZE = ModelSize(
    text_hidden=128, text_layers=2, text_heads=4, text_kv_heads=2, text_intermediate=384, mrope_section=(4, 6, 6),
    vision_hidden=64, vision_depth=2, vision_heads=2, vision_intermediate=128,
)  # fmt: skip


def vocab_rows(tokens: int) -> int:
    """Rows of the embedding and output matrices for a tokenizer of `tokens` tokens (a multiple of 64)."""
    return -(-tokens // 64) * 64


def model_config(tokenizer: PreTrainedTokenizerFast, size: ModelSize = FIXTURE_SIZE) -> Qwen2_5_VLConfig:
    head_dim = size.text_hidden // size.text_heads
    if sum(size.mrope_section) * 2 != head_dim:
        raise ValueError(f"mrope_section {size.mrope_section} must sum to head_dim / 2 = {head_dim // 2}")
    ids = tokenizer.convert_tokens_to_ids
    text = {
        "vocab_size": vocab_rows(len(tokenizer)),
        "hidden_size": size.text_hidden,
        "intermediate_size": size.text_intermediate,
        "num_hidden_layers": size.text_layers,
        "num_attention_heads": size.text_heads,
        "num_key_value_heads": size.text_kv_heads,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(size.mrope_section)},
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": size.vision_depth,
        "hidden_size": size.vision_hidden,
        "intermediate_size": size.vision_intermediate,
        "num_heads": size.vision_heads,
        "out_hidden_size": size.text_hidden,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [size.vision_depth - 1],
        "in_channels": 3,
    }
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
        dtype="float32",
    )


def make_processor(tokenizer: PreTrainedTokenizerFast) -> Qwen2_5_VLProcessor:
    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(size=size),
        chat_template=CHAT_TEMPLATE,
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast, size: ModelSize = FIXTURE_SIZE, seed: int = 0
) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised float32 model (the same weights for the same seed and size)."""
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(model_config(tokenizer, size))
    model.generation_config = generation_config(tokenizer)
    return model.float()


def generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    ids = tokenizer.convert_tokens_to_ids
    # Greedy by default: vLLM applies generation_config.json's sampling fields as request defaults.
    return GenerationConfig(
        do_sample=False,
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")],
        pad_token_id=ids("<|endoftext|>"),
    )


def save(
    model: Qwen2_5_VLForConditionalGeneration,
    processor: Qwen2_5_VLProcessor,
    out_dir: Path,
    digest: str,
    info: dict | None = None,
) -> None:
    """Writes a model directory that both transformers and vLLM load; `digest` marks what built it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    # tokenizer.json, tokenizer_config.json, chat_template.jinja and processor_config.json (transformers 5
    # keeps the image processor's settings there; there is no preprocessor_config.json).
    processor.save_pretrained(out_dir)
    (out_dir / "training_info.json").write_text(json.dumps(info or {}, indent=2, sort_keys=True) + "\n")
    (out_dir / DIGEST_FILE).write_text(digest + "\n")


def built_digest(model_dir: Path) -> str | None:
    path = Path(model_dir) / DIGEST_FILE
    return path.read_text().strip() if path.is_file() else None
