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
from faithproxy.faithcore.context import Regeneration, RequestView, Usage
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

    async def regenerate(self, view: RequestView, prefix: list[str], bad_step: Step, attempt: int) -> Regeneration:
        """A rewrite that is neither the flagged sentence nor one rejected before, or None; with the
        tokens of every call the try made."""
        seen = {bad_step.text.strip(), *(r.strip() for r in bad_step.rejected)}
        prompt = build_regeneration_prompt(view.question, prefix, bad_step.text)
        body: dict[str, Any] = {
            "model": view.model,
            "messages": [{"role": "user", "content": [*image_parts(view.messages), {"type": "text", "text": prompt}]}],
            "max_tokens": self.max_tokens,
            "stream": False,
        }
        usage = Usage()
        if attempt == 1 or self.temperature <= 0:
            candidate = await self._most_agreed_new(body | {"temperature": 0.0}, seen, usage)
            if candidate is not None or self.temperature <= 0:
                return Regeneration(candidate, usage)
        # vLLM seeds the n samples of one request seed, seed + 1, ...: spacing the tries' seeds by n
        # keeps every sample of every try distinct and the whole retry sequence reproducible.
        sampled = {"temperature": self.temperature, "n": self.samples, "seed": attempt * self.samples}
        return Regeneration(await self._most_agreed_new(body | sampled, seen, usage), usage)

    async def _most_agreed_new(self, body: dict[str, Any], seen: set[str], usage: Usage) -> str | None:
        """One call; its tokens go into `usage`, the try's own tally."""
        try:
            completion = await self.generator.chat(body)
        except UpstreamError as exc:
            raise RegenerationError(f"regeneration call failed: {exc.message}", code=exc.code) from exc
        usage.add(completion.get("usage"))
        votes = Counter(
            sentence for sentence in map(parse_bracketed, choice_texts(completion)) if sentence and sentence not in seen
        )
        return max(votes, key=votes.__getitem__) if votes else None  # max keeps the earliest of a tie
