"""Fixed ShapesWorld sets shared by the tests: rendered once per session, because rendering and parsing
300 scenes takes about a second of the shared CPUs."""

from __future__ import annotations

import pytest

from faithproxy.benchmarks.shapesworld.parser import ParsedScene, parse_image
from faithproxy.benchmarks.shapesworld.scenes import Scene, generate_scene, render

FIXED_SEED = 20240601
FIXED_COUNT = 300


@pytest.fixture(scope="session")
def fixed_scenes() -> list[Scene]:
    return [generate_scene(FIXED_SEED, i) for i in range(FIXED_COUNT)]


@pytest.fixture(scope="session")
def fixed_parsed(fixed_scenes: list[Scene]) -> list[ParsedScene]:
    return [parse_image(render(s)) for s in fixed_scenes]
