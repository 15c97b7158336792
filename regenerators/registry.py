"""Regenerators by name (the `regenerator` setting)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
        "resample": Entry(
            "faithproxy.regenerators.resample:ResampleRegenerator",
            "the claim the generator's own samples from the same prefix make most often instead",
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
    claims: str | None = None,
) -> Regenerator:
    """The regenerator registered as `name`; every regenerator takes the generator (injected here, never
    carried by the request's view) and these settings; `insist_share` is passed only when set, so a
    regenerator without early stop is built as before; `claims` (the consistency detector's claim reader)
    only to a regenerator that declares `reads_claims`.
    An unknown name raises UnknownName (also a ValueError) with a suggestion."""
    cls = REGENERATORS.resolve(name)
    extra: dict[str, Any] = {} if insist_share is None else {"insist_share": insist_share}
    if claims is not None and getattr(cls, "reads_claims", False):
        extra["claims"] = claims
    return cls(generator, temperature=temperature, max_tokens=max_tokens, samples=samples, **extra)  # type: ignore[call-arg]
