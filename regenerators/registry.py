"""Regenerators by name (the `regenerator` setting)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from faithproxy.faithcore.registry import Entry, Registry
from faithproxy.regenerators.base import Regenerator

if TYPE_CHECKING:
    from faithproxy.clients.vllm import VLLMClient

REGENERATORS: Registry[type[Regenerator]] = Registry(
    "regenerator",
    Regenerator,
    {
        "reflect": Entry(
            "faithproxy.regenerators.reflect:ReflectRegenerator",
            "rewrite the flagged step with the generator and the image (paper, Table 16)",
        ),
    },
)


def build_regenerator(
    name: str,
    generator: VLLMClient,
    *,
    temperature: float,
    max_tokens: int,
    samples: int,
    insist_share: float | None = None,
) -> Regenerator:
    """The regenerator registered as `name`; every regenerator takes the generator (injected here, never
    carried by the request's view) and these settings; `insist_share` is passed only when set, so a
    regenerator without early stop is built as before.
    An unknown name raises UnknownName (also a ValueError) with a suggestion."""
    cls = REGENERATORS.resolve(name)
    extra = {} if insist_share is None else {"insist_share": insist_share}
    return cls(generator, temperature=temperature, max_tokens=max_tokens, samples=samples, **extra)  # type: ignore[call-arg]
