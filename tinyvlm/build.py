"""The fixture model's architecture: a tiny Qwen2.5-VL, built from code with random weights.

Sizes are chosen for vLLM's CPU backend: the text head_dim (128 / 4 heads = 32) is one its attention
kernel accepts, and mrope_section [4, 6, 6] sums to head_dim / 2. The vision tower has 2 blocks and a
window (112 px) that covers a whole fixture image, so window and full attention see the same tokens.
The image processor keeps the 112×112 fixture images as they are (16 image tokens each) and shrinks
anything bigger to at most 224×224 pixels (64 tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

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

from faithproxy.tinyvlm.tokenizer import CHAT_TEMPLATE

MIN_PIXELS = 56 * 56
MAX_PIXELS = 224 * 224
DIGEST_FILE = "fixture_digest.txt"


def model_config(tokenizer: PreTrainedTokenizerFast) -> Qwen2_5_VLConfig:
    ids = tokenizer.convert_tokens_to_ids
    vocab = -(-len(tokenizer) // 64) * 64
    text = {
        "vocab_size": vocab,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": 128,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1],
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


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised model (the same weights for the same seed)."""
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(model_config(tokenizer))
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
