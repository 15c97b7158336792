"""Regenerators by name, through the shared registry."""

from __future__ import annotations

import pytest

from faithproxy.clients.vllm import VLLMClient
from faithproxy.faithcore.registry import UnknownName
from faithproxy.regenerators.reflect import ReflectRegenerator
from faithproxy.regenerators.registry import REGENERATORS, build_regenerator


async def test_build_by_name_passes_the_settings() -> None:
    generator = VLLMClient("http://127.0.0.1:9")
    try:
        regenerator = build_regenerator("reflect", generator, temperature=0.3, max_tokens=64, samples=4)
    finally:
        await generator.aclose()
    assert isinstance(regenerator, ReflectRegenerator)
    assert (regenerator.generator, regenerator.temperature, regenerator.max_tokens, regenerator.samples) == (
        generator, 0.3, 64, 4,
    )  # fmt: skip
    assert REGENERATORS.listing() == [(name, REGENERATORS[name].description) for name in ("reflect", "resample")]
    assert regenerator.insist_share is None  # early stop is off unless the setting is given


async def test_the_insist_share_setting_reaches_the_regenerator() -> None:
    generator = VLLMClient("http://127.0.0.1:9")
    try:
        regenerator = build_regenerator("reflect", generator, temperature=0.8, max_tokens=64, samples=8,
                                        insist_share=0.75)  # fmt: skip
    finally:
        await generator.aclose()
    assert isinstance(regenerator, ReflectRegenerator) and regenerator.insist_share == 0.75


def test_an_unknown_name_is_suggested_and_still_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown regenerator 'reflct'; did you mean 'reflect'") as info:
        build_regenerator("reflct", None, temperature=0.0, max_tokens=8, samples=1)  # type: ignore[arg-type]
    assert isinstance(info.value, UnknownName)
