import hashlib
import json
import os
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from faithproxy.benchmarks.shapesworld.scenes import DEFAULT_SIZE, MAX_OBJECTS, Scene, generate_scene, png_bytes, render
from faithproxy.benchmarks.shapesworld.world import (
    BACKGROUND,
    COLOURS,
    PALETTE,
    SHAPES,
    SIZES,
    cell_bounds,
    side_lengths,
)


def _digest(scenes: list[Scene]) -> str:
    return hashlib.sha256(json.dumps([s.to_dict() for s in scenes], sort_keys=True).encode()).hexdigest()


def test_same_seed_and_index_give_identical_png_and_description():
    for index in range(20):
        a, b = generate_scene(7, index), generate_scene(7, index)
        assert a == b
        assert png_bytes(render(a)) == png_bytes(render(b))


def test_scenes_do_not_depend_on_the_process_hash_seed():
    code = (
        "import hashlib, json; from faithproxy.benchmarks.shapesworld.scenes import generate_scene;"
        "print(hashlib.sha256(json.dumps([generate_scene(3, i).to_dict() for i in range(30)],"
        " sort_keys=True).encode()).hexdigest())"
    )
    root = str(Path(__file__).resolve().parents[3])
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outputs == {_digest([generate_scene(3, i) for i in range(30)])}


def test_different_indices_and_seeds_give_different_scenes(fixed_scenes):
    descriptions = {json.dumps(s.to_dict()["objects"]) for s in fixed_scenes}
    assert len(descriptions) == len(fixed_scenes)
    assert generate_scene(1, 0).objects != generate_scene(2, 0).objects


def test_objects_stay_in_their_own_cell_and_never_touch(fixed_scenes):
    sides = set(side_lengths(DEFAULT_SIZE, DEFAULT_SIZE).values())
    for scene in fixed_scenes:
        assert 1 <= len(scene.objects) <= MAX_OBJECTS
        assert len({o.cell for o in scene.objects}) == len(scene.objects)
        for o in scene.objects:
            x0, y0, x1, y1 = o.bbox
            assert x1 - x0 == y1 - y0 in sides
            cx, cy = cell_bounds(scene.width, o.col), cell_bounds(scene.height, o.row)
            assert cx[0] < x0 and x1 < cx[1] and cy[0] < y0 and y1 < cy[1]
        for a, b in combinations(scene.objects, 2):  # at least one free pixel between any two boxes
            assert a.bbox[2] < b.bbox[0] or b.bbox[2] < a.bbox[0] or a.bbox[3] < b.bbox[1] or b.bbox[3] < a.bbox[1]


def test_rendering_is_flat_palette_colours_on_white(fixed_scenes):
    allowed = {BACKGROUND, *PALETTE.values()}
    for scene in fixed_scenes[:50]:
        pixels = np.asarray(render(scene))
        assert _colours(pixels) <= allowed
        outside = np.ones(pixels.shape[:2], dtype=bool)
        for o in scene.objects:
            x0, y0, x1, y1 = o.bbox
            assert PALETTE[o.colour] in _colours(pixels[y0:y1, x0:x1]) <= {BACKGROUND, PALETTE[o.colour]}
            outside[y0:y1, x0:x1] = False
        assert _colours(pixels[outside]) == {BACKGROUND}


def _colours(pixels: np.ndarray) -> set[tuple[int, ...]]:
    return {tuple(int(v) for v in p) for p in np.unique(pixels.reshape(-1, 3), axis=0)}


def test_every_attribute_value_occurs(fixed_scenes):
    objects = [o for s in fixed_scenes for o in s.objects]
    assert {o.shape for o in objects} == set(SHAPES)
    assert {o.colour for o in objects} == set(COLOURS)
    assert {o.size for o in objects} == set(SIZES)
    assert {len(s.objects) for s in fixed_scenes} == set(range(1, MAX_OBJECTS + 1))


def test_default_canvas_is_square_84_one_token_per_cell():
    image = render(generate_scene(0, 0))
    assert image.size == (84, 84) and image.mode == "RGB"


@pytest.mark.parametrize(("width", "height"), [(72, 72), (224, 224), (160, 112)])
def test_canvas_size_is_configurable(width, height):
    scene = generate_scene(0, 5, width=width, height=height)
    assert render(scene).size == (width, height)
    for o in scene.objects:
        assert 0 <= o.bbox[0] and o.bbox[2] <= width and 0 <= o.bbox[1] and o.bbox[3] <= height


def test_too_small_canvas_is_refused():
    with pytest.raises(ValueError):
        generate_scene(0, 0, width=64)


def test_a_known_scene_is_pinned():
    """Changing the generator changes every dataset built from it: make that a deliberate edit."""
    scene = generate_scene(0, 1)
    assert [(o.shape, o.colour, o.size, o.row, o.col, o.bbox) for o in scene.objects] == [
        ("triangle", "yellow", "small", 0, 1, (37, 7, 46, 16)),
        ("square", "green", "small", 0, 2, (66, 10, 75, 19)),
    ]
