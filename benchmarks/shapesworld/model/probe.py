"""A training-only read-out of the scene from the vision tower's output: the cell probe.

Trained on reference chains alone, the first model here drifted into ignoring the image: AdamW grew
a large constant in the vision tower's residual stream (the same vector for every patch, std ~60
against differences of ~0.02), after which every image gave the text model the same tokens, and
held-out loss with shuffled images equalled the loss with the true ones. Once there, the chain loss
has no gradient left to undo it.

The probe gives the vision tower a direct signal instead: images are 84x84, so the merged tokens form
a 3x3 grid that lines up with the 3x3 grid of cells (28 px each), and one linear map, shared by all
tokens, reads token i as the contents of cell i (empty or which shape; colour and size where there is
an object), trained with cross-entropy on the scene's ground truth next to the chain loss. Keeping
each cell's contents in its own token is what makes them easy for the text model to look up: the
second run (112 px, 16 tokens, a probe over all tokens at once) still described objects in empty
cells in 70% of its perception sentences after 50k samples. It is not
part of the model: it is never saved with it, vLLM never sees it, and the text model still has to
learn to read the tokens and say what is there, so the errors it makes remain its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from faithproxy.benchmarks.shapesworld.scenes import Scene
from faithproxy.benchmarks.shapesworld.world import CELLS, COLOURS, SHAPES, SIZES

IGNORE = -100


class CellProbe(torch.nn.Module):
    def __init__(self, tokens_per_image: int, hidden: int) -> None:
        super().__init__()
        if tokens_per_image != len(CELLS):
            raise ValueError(f"the cell probe needs one image token per cell ({len(CELLS)}), got {tokens_per_image}")
        self.tokens_per_image = tokens_per_image
        self.shape = torch.nn.Linear(hidden, 1 + len(SHAPES))
        self.colour = torch.nn.Linear(hidden, len(COLOURS))
        self.size = torch.nn.Linear(hidden, len(SIZES))

    def loss(self, features: torch.Tensor, scenes: Sequence[Scene]) -> tuple[torch.Tensor, float]:
        """Mean cross-entropy over cells and attributes, and the share of cells read entirely right.

        `features` are the vision tower's merged tokens for the batch's images, in order.
        """
        x = features.reshape(len(scenes), len(CELLS), -1)  # merged tokens come in raster order, as cells do
        shape_t, colour_t, size_t = cell_targets(scenes)
        heads = ((self.shape, shape_t, 1 + len(SHAPES)), (self.colour, colour_t, len(COLOURS)), (self.size, size_t, 2))
        total = features.new_zeros(())
        right = torch.ones_like(shape_t, dtype=torch.bool)
        for head, target, classes in heads:
            logits = head(x).reshape(len(scenes), len(CELLS), classes)
            total = total + torch.nn.functional.cross_entropy(logits.reshape(-1, classes), target.reshape(-1))
            right &= (logits.argmax(-1) == target) | (target == IGNORE)
        return total / len(heads), right.float().mean().item()


class PositionProbe(torch.nn.Module):
    """Reads, from each merged image token alone, which cell it covers.

    The first 84 px run learned what is in the image (the cell probe read 97% of cells right) but
    still put objects in the wrong column: the text model has only rotary position differences to
    tell image tokens apart, and a 4-layer model reads them poorly. This head makes the vision tower
    write each token's own cell into the token's content, where the text model can read it directly.
    Like the cell probe it is training-only and never saved with the model.
    """

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.cell = torch.nn.Linear(hidden, len(CELLS))

    def loss(self, features: torch.Tensor, images: int) -> tuple[torch.Tensor, float]:
        """Cross-entropy of each token's cell, and the share of tokens placed right."""
        x = features.reshape(images, len(CELLS), -1)
        logits = self.cell(x).reshape(-1, len(CELLS))
        target = torch.arange(len(CELLS)).repeat(images)
        loss = torch.nn.functional.cross_entropy(logits, target)
        return loss, (logits.argmax(-1) == target).float().mean().item()


def cell_targets(scenes: Sequence[Scene]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per scene and cell: 0 for empty or 1 + shape index; colour and size indices (IGNORE if empty)."""
    shape = torch.zeros(len(scenes), len(CELLS), dtype=torch.long)
    colour = torch.full_like(shape, IGNORE)
    size = torch.full_like(shape, IGNORE)
    for i, scene in enumerate(scenes):
        for obj in scene.objects:
            c = CELLS.index(obj.cell)
            shape[i, c] = 1 + SHAPES.index(obj.shape)
            colour[i, c] = COLOURS.index(obj.colour)
            size[i, c] = SIZES.index(obj.size)
    return shape, colour, size


class VisionTap:
    """Keeps the vision tower's last output (the merged image tokens) during a forward pass."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.features: torch.Tensor | None = None
        model.model.visual.register_forward_hook(self._keep)  # type: ignore[union-attr,operator]

    def _keep(self, module: torch.nn.Module, args: object, output: object) -> None:
        pooled = getattr(output, "pooler_output", output)
        self.features = pooled if isinstance(pooled, torch.Tensor) else pooled[0]  # type: ignore[index]
