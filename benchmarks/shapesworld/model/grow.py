"""Deepening a trained model in place: new decoder layers that start as the identity.

Why: the 4-layer text model learned to see (perception errors in the 5-30% band) but its reasoning
after the perception sentences stayed weak (the right option text in 57% of chains, its letter in
63%), and its training curves had flattened. Training a deeper model from scratch costs the two hours
the first one took; growing the trained one keeps everything it knows and adds room. A new layer's
output projections (attention `o_proj`, MLP `down_proj`) start at zero, so at the step it joins the
model computes exactly what it computed before (tested), and training then finds a use for it. This
is the "block expansion" of LLaMA Pro (Wu et al., 2024); its code is not used here.

Growth is in place, so hooks on the vision tower (`probe.VisionTap`) and the optimizer's hold on the
old parameters survive; the new parameters join the optimizer as a group of their own (`grow`'s
return value), which a resumed run rebuilds in the same order before loading the optimizer state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def grow(model: Any, positions: Sequence[int], seed: int) -> list[torch.nn.Parameter]:
    """Inserts a fresh decoder layer at each index of `positions` (indices in the grown stack, so
    `(2, 5)` turns layers [0 1 2 3] into [0 1 new 2 3 new]); returns the new layers' parameters."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLDecoderLayer

    text = model.model.language_model
    config = text.config
    old = list(text.layers)
    total = len(old) + len(positions)
    if len(set(positions)) != len(positions) or not all(0 <= p < total for p in positions):
        raise ValueError(f"positions {list(positions)} must be distinct indices below {total}")
    if len(set(config.layer_types)) != 1:
        raise ValueError(f"only stacks of one attention type can grow, not {config.layer_types}")
    config.num_hidden_layers = total
    config.layer_types = [config.layer_types[0]] * total
    generator = torch.Generator().manual_seed(seed)
    layers, fresh = [], []
    for index in range(total):
        if index in positions:
            layer = Qwen2_5_VLDecoderLayer(config, index)
            _init_as_identity(layer, config.initializer_range, generator)
            fresh += list(layer.parameters())
        else:
            layer = old.pop(0)
            layer.self_attn.layer_idx = index  # the KV cache is indexed by it
        layers.append(layer)
    text.layers = torch.nn.ModuleList(layers)
    return fresh


def grown_positions(text: str) -> tuple[int, ...]:
    """Parses `--grow`'s positions, e.g. "2,5"."""
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"expected comma-separated layer indices, got {text!r}")
    return tuple(int(p) for p in parts)


def _init_as_identity(layer: torch.nn.Module, std: float, generator: torch.Generator) -> None:
    with torch.no_grad():
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                if name.endswith(("o_proj", "down_proj")):
                    module.weight.zero_()  # adds nothing to the residual stream until trained
                else:
                    module.weight.normal_(0.0, std, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()
