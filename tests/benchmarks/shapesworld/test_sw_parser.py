import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from faithproxy.benchmarks.shapesworld.parser import parse_image
from faithproxy.benchmarks.shapesworld.scenes import draw_shape, generate_scene, png_bytes, render
from faithproxy.benchmarks.shapesworld.world import PALETTE, SHAPES


def _recovered(scene, parsed) -> int:
    found = {(o.describe(), o.bbox) for o in parsed.objects}
    return sum((o.describe(), o.bbox) in found for o in scene.objects)


def test_parser_recovers_the_fixed_set(fixed_scenes, fixed_parsed):
    """Measured at the time of writing: 740 / 740 objects (attributes, cell and exact box) recovered."""
    total = sum(len(s.objects) for s in fixed_scenes)
    recovered = sum(_recovered(s, p) for s, p in zip(fixed_scenes, fixed_parsed, strict=True))
    assert len(fixed_scenes) >= 300
    assert recovered / total >= 0.99, f"{recovered}/{total}"
    spurious = sum(max(0, len(p.objects) - len(s.objects)) for s, p in zip(fixed_scenes, fixed_parsed, strict=True))
    assert spurious == 0


@pytest.mark.parametrize(("width", "height"), [(72, 72), (100, 100), (224, 224), (160, 112)])
def test_parser_recovers_other_canvas_sizes(width, height):
    scenes = [generate_scene(11, i, width=width, height=height) for i in range(40)]
    total = sum(len(s.objects) for s in scenes)
    assert sum(_recovered(s, parse_image(render(s))) for s in scenes) == total


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), index=st.integers(0, 10**6))
def test_parser_matches_any_scene(seed, index):
    scene = generate_scene(seed, index)
    parsed = parse_image(render(scene))
    assert [o.describe() for o in parsed.objects] == [o.describe() for o in scene.objects]


@pytest.mark.parametrize("shape", SHAPES)
def test_shape_classifier_holds_for_every_odd_side(shape):
    """Every side a canvas of 72-520 pixels can produce, drawn alone."""
    for side in range(9, 201, 2):
        image = Image.new("RGB", (side + 8, side + 8), (255, 255, 255))
        draw_shape(ImageDraw.Draw(image), shape, (4, 4, 4 + side, 4 + side), PALETTE["purple"])
        (obj,) = parse_image(image).objects
        assert (obj.shape, obj.colour, obj.bbox) == (shape, "purple", (4, 4, 4 + side, 4 + side)), side


def test_parser_reads_png_bytes_and_paths(tmp_path):
    scene = generate_scene(5, 3)
    data = png_bytes(render(scene))
    path = tmp_path / "scene.png"
    path.write_bytes(data)
    expected = [o.describe() for o in scene.objects]
    for source in (data, path, str(path), Image.open(io.BytesIO(data))):
        assert [o.describe() for o in parse_image(source).objects] == expected


def test_blank_image_has_no_objects():
    assert parse_image(Image.new("RGB", (112, 112), (255, 255, 255))).objects == ()


def test_specks_are_ignored():
    image = render(generate_scene(5, 3))
    image.putpixel((0, 0), (0, 0, 0))
    assert len(parse_image(image).objects) == len(generate_scene(5, 3).objects)
