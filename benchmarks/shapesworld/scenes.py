"""Seeded scene generation and rendering.

A scene is a pure function of (seed, index, canvas size): the random stream is seeded with a string,
which Python hashes with SHA-512 whatever PYTHONHASHSEED is, so scenes are the same on every machine.
Rendering uses PIL's non-antialiased primitives on an RGB canvas, so every object pixel is exactly a
palette colour and the parser's job is exact.
"""

from __future__ import annotations

import io
import random
from dataclasses import asdict, dataclass
from typing import Any

from PIL import Image, ImageDraw

from faithproxy.benchmarks.shapesworld.world import (
    BACKGROUND,
    CELLS,
    COLOURS,
    MIN_CANVAS,
    PALETTE,
    SHAPES,
    SIZES,
    WorldObject,
    cell_bounds,
    side_lengths,
)

# Square (a known vLLM/transformers mismatch concerns non-square patch grids) and 3 x 28 px: the model's
# 14 px patches merge 2x2 into exactly one image token per grid cell (see benchmarks/shapesworld/model/probe.py).
DEFAULT_SIZE = 84
MAX_OBJECTS = 4
_MARGIN = 2  # free pixels between an object and its cell's edge, so objects never touch


@dataclass(frozen=True)
class SceneObject(WorldObject):
    """An object of a generated scene, with its exact bounding box (x0, y0, x1, y1), ends exclusive."""

    bbox: tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclass(frozen=True)
class Scene:
    """The exact description of one image. Objects are in reading order (row, then column)."""

    seed: int
    index: int
    width: int
    height: int
    objects: tuple[SceneObject, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def generate_scene(
    seed: int, index: int, *, width: int = DEFAULT_SIZE, height: int | None = None, max_objects: int = MAX_OBJECTS
) -> Scene:
    height = width if height is None else height
    if min(width, height) < MIN_CANVAS:
        raise ValueError(f"canvas {width}x{height} is below the {MIN_CANVAS}-pixel minimum side")
    if not 1 <= max_objects <= len(CELLS):
        raise ValueError(f"max_objects must be in 1..{len(CELLS)}")
    rng = random.Random(f"shapesworld:{seed}:{index}")
    sides = side_lengths(width, height)
    count = rng.randint(1, max_objects)
    cells = sorted(rng.sample(CELLS, count))
    objects = []
    for row, col in cells:
        shape, colour, size = rng.choice(SHAPES), rng.choice(COLOURS), rng.choice(SIZES)
        side = sides[size]
        x_lo, x_hi = cell_bounds(width, col)
        y_lo, y_hi = cell_bounds(height, row)
        x0 = rng.randint(x_lo + _MARGIN, x_hi - _MARGIN - side)
        y0 = rng.randint(y_lo + _MARGIN, y_hi - _MARGIN - side)
        objects.append(SceneObject(shape, colour, size, row, col, bbox=(x0, y0, x0 + side, y0 + side)))
    return Scene(seed=seed, index=index, width=width, height=height, objects=tuple(objects))


def render(scene: Scene) -> Image.Image:
    image = Image.new("RGB", (scene.width, scene.height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for obj in scene.objects:
        draw_shape(draw, obj.shape, obj.bbox, PALETTE[obj.colour])
    return image


def draw_shape(
    draw: ImageDraw.ImageDraw, shape: str, bbox: tuple[int, int, int, int], fill: tuple[int, int, int]
) -> None:
    """Draw one shape filling the square `bbox` (ends exclusive; the side is odd)."""
    x0, y0, x1, y1 = bbox
    side = x1 - x0
    xl, yl = x1 - 1, y1 - 1  # PIL boxes are inclusive
    if shape == "square":
        draw.rectangle((x0, y0, xl, yl), fill=fill)
    elif shape == "circle":
        draw.ellipse((x0, y0, xl, yl), fill=fill)
    elif shape == "triangle":
        draw.polygon([(x0 + side // 2, y0), (x0, yl), (xl, yl)], fill=fill)
    elif shape == "cross":
        arm = 2 * round((side / 3 - 1) / 2) + 1  # the odd width nearest a third: centred arms, fill <= 0.62
        a = (side - arm) // 2
        draw.rectangle((x0, y0 + a, xl, y0 + a + arm - 1), fill=fill)
        draw.rectangle((x0 + a, y0, x0 + a + arm - 1, yl), fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def png_bytes(image: Image.Image) -> bytes:
    """PNG encoding with fixed settings, so the bytes (and their hash) are reproducible."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()
