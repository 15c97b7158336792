"""`reflect`: the generator rewrites its own flagged step, looking at the image again (paper, Table 16).

A try whose rewrite is the flagged sentence again, or a rewrite the detector already rejected, is a
wasted detector call and a wasted try. Small models do this a lot: asked to recount, they recount to
the same wrong number. So a sampled try asks vLLM for `samples` rewrites in one request (`n`) and
takes the one most of them agree on among those not seen yet (ties: the earliest), as in
self-consistency decoding; the detector still checks every candidate it is given.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

from faithproxy.clients.vllm import VLLMClient, choice_texts
from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.errors import RegenerationError, UpstreamError
from faithproxy.faithcore.images import image_parts
from faithproxy.faithcore.types import Step
from faithproxy.regenerators.base import Regenerator
from faithproxy.regenerators.prompts import build_regeneration_prompt, parse_bracketed


class ReflectRegenerator(Regenerator):
    name: ClassVar[str] = "reflect"

    def __init__(
        self, generator: VLLMClient, *, temperature: float = 0.8, max_tokens: int = 128, samples: int = 8
    ) -> None:
        if samples < 1:
            raise ValueError("samples must be >= 1")
        self.generator = generator
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.samples = samples

    async def regenerate(self, ctx: ChainContext, prefix: list[str], bad_step: Step, attempt: int) -> str | None:
        """A rewrite that is neither the flagged sentence nor one rejected before, or None."""
        seen = {bad_step.text.strip(), *(r.strip() for r in bad_step.rejected)}
        prompt = build_regeneration_prompt(ctx.question, prefix, bad_step.text)
        body: dict[str, Any] = {
            "model": ctx.model,
            "messages": [{"role": "user", "content": [*image_parts(ctx.messages), {"type": "text", "text": prompt}]}],
            "max_tokens": self.max_tokens,
            "stream": False,
        }
        if attempt == 1 or self.temperature <= 0:
            candidate = await self._most_agreed_new(ctx, body | {"temperature": 0.0}, seen)
            if candidate is not None or self.temperature <= 0:
                return candidate
        # vLLM seeds the n samples of one request seed, seed + 1, ...: spacing the tries' seeds by n
        # keeps every sample of every try distinct and the whole retry sequence reproducible.
        sampled = {"temperature": self.temperature, "n": self.samples, "seed": attempt * self.samples}
        return await self._most_agreed_new(ctx, body | sampled, seen)

    async def _most_agreed_new(self, ctx: ChainContext, body: dict[str, Any], seen: set[str]) -> str | None:
        try:
            completion = await self.generator.chat(body)
        except UpstreamError as exc:
            raise RegenerationError(f"regeneration call failed: {exc.message}", code=exc.code) from exc
        ctx.usage.add(completion.get("usage"))
        votes = Counter(
            sentence for sentence in map(parse_bracketed, choice_texts(completion)) if sentence and sentence not in seen
        )
        return max(votes, key=votes.__getitem__) if votes else None  # max keeps the earliest of a tie
