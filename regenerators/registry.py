"""Regenerators by name."""

from __future__ import annotations

from faithproxy.clients.vllm import VLLMClient
from faithproxy.regenerators.base import Regenerator

REGENERATORS = {"reflect": "rewrite the flagged step with the generator and the image (paper, Table 16)"}


def build_regenerator(
    name: str, generator: VLLMClient, *, temperature: float, max_tokens: int, samples: int
) -> Regenerator:
    if name == "reflect":
        from faithproxy.regenerators.reflect import ReflectRegenerator

        return ReflectRegenerator(generator, temperature=temperature, max_tokens=max_tokens, samples=samples)
    raise ValueError(f"unknown regenerator {name!r}; known: {', '.join(REGENERATORS)}")
