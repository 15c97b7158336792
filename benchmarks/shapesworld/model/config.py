"""ShapesWorld's model sizes; the Qwen2.5-VL config built from them is `tinyvlm.build`'s.

Images are 84x84 (square: a non-square patch grid is where vLLM and transformers were seen to disagree),
i.e. a 6x6 patch grid merged to 9 image tokens, one per grid cell. The config, processor, generation
config and saving all come from `tinyvlm.build` (see its constraints from vLLM's CPU backend), so both
tiny models are built and laid out on disk the same way.
"""

from __future__ import annotations

import torch

from faithproxy.benchmarks.tinyvlm.build import ModelSize, build_model, model_config, vocab_rows

__all__ = ["SIZES", "ModelSize", "build_model", "count_parameters", "model_config", "vocab_rows"]

SIZES: dict[str, ModelSize] = {
    # ~3.9M parameters; the trial: text 256 x 4 layers learns ShapesWorld in about an hour.
    # The committed model started here and was grown to 6 text layers (5.1M) at step 11343 (grow.py).
    "full": ModelSize(
        text_hidden=256, text_layers=4, text_heads=4, text_kv_heads=2, text_intermediate=512, mrope_section=(8, 12, 12),
        vision_hidden=128, vision_depth=4, vision_heads=2, vision_intermediate=256,
    ),
    # For CI: trains and evaluates in seconds, learns nothing.
    "smoke": ModelSize(
        text_hidden=64, text_layers=1, text_heads=2, text_kv_heads=1, text_intermediate=128, mrope_section=(4, 6, 6),
        vision_hidden=32, vision_depth=1, vision_heads=1, vision_intermediate=64,
    ),
}  # fmt: skip


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
