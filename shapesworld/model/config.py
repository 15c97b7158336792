"""Model sizes and the Qwen2.5-VL config built from them.

Constraints from vLLM's CPU backend (see ../shared/notes/VLLM_CPU.md): the text head_dim must be one
its attention kernel accepts (32, 64, 80, ...) and `mrope_section` must sum to head_dim / 2. Images
are 84x84 (square: a non-square patch grid is where vLLM and transformers were seen to disagree),
i.e. a 6x6 patch grid merged to 9 image tokens, one per grid cell; the vision window (112 px) covers
the whole image, so window and full attention see the same tokens. The processor, generation config and saving come
from `tinyvlm.build`, so both tiny models are laid out the same way on disk.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ModelSize:
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


SIZES: dict[str, ModelSize] = {
    # ~3.9M parameters; the trial: text 256 x 4 layers learns ShapesWorld in about an hour.
    # The committed model started here and was grown to 6 text layers (5.1M) at step 11343 (grow.py).
    "full": ModelSize(
        text_hidden=256,
        text_layers=4,
        text_heads=4,
        text_kv_heads=2,
        text_intermediate=512,
        mrope_section=(8, 12, 12),
        vision_hidden=128,
        vision_depth=4,
        vision_heads=2,
        vision_intermediate=256,
    ),
    # For CI: trains and evaluates in seconds, learns nothing.
    "smoke": ModelSize(
        text_hidden=64,
        text_layers=1,
        text_heads=2,
        text_kv_heads=1,
        text_intermediate=128,
        mrope_section=(4, 6, 6),
        vision_hidden=32,
        vision_depth=1,
        vision_heads=1,
        vision_intermediate=64,
    ),
}


def vocab_rows(tokens: int) -> int:
    """Rows of the embedding and output matrices for a tokenizer of `tokens` tokens (a multiple of 64)."""
    return -(-tokens // 64) * 64


def model_config(tokenizer: Any, size: ModelSize) -> Any:
    from transformers import Qwen2_5_VLConfig

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


def build_model(tokenizer: Any, size: ModelSize, seed: int) -> Any:
    """Randomly initialised float32 model (the same weights for the same seed and size)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from faithproxy.tinyvlm.build import generation_config

    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(model_config(tokenizer, size))
    model.generation_config = generation_config(tokenizer)
    return model.float()


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
