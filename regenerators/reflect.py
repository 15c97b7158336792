"""`reflect`: the generator rewrites its own flagged step, looking at the image again (paper, Table 16)."""

from __future__ import annotations

from typing import Any, ClassVar

from clients.vllm import VLLMClient, assistant_text_of
from detectors.base import ChainContext
from faithcore.errors import RegenerationError, UpstreamError
from faithcore.images import image_parts
from faithcore.types import Step
from regenerators.base import Regenerator
from regenerators.prompts import build_regeneration_prompt, parse_bracketed


class ReflectRegenerator(Regenerator):
    name: ClassVar[str] = "reflect"

    def __init__(self, generator: VLLMClient, *, temperature: float = 0.8, max_tokens: int = 128) -> None:
        self.generator = generator
        self.temperature = temperature
        self.max_tokens = max_tokens

    async def regenerate(self, ctx: ChainContext, prefix: list[str], bad_step: Step, attempt: int) -> str | None:
        prompt = build_regeneration_prompt(ctx.question, prefix, bad_step.text)
        body: dict[str, Any] = {
            "model": ctx.model,
            "messages": [{"role": "user", "content": [*image_parts(ctx.messages), {"type": "text", "text": prompt}]}],
            "max_tokens": self.max_tokens,
            "stream": False,
        }
        if attempt == 1 or self.temperature <= 0:
            body["temperature"] = 0.0
        else:
            body["temperature"] = self.temperature
            body["seed"] = attempt  # reproducible retries
        try:
            completion = await self.generator.chat(body)
        except UpstreamError as exc:
            raise RegenerationError(f"regeneration call failed: {exc.message}", code=exc.code) from exc
        ctx.usage.add(completion.get("usage"))
        sentence = parse_bracketed(assistant_text_of(completion))
        if sentence is None or sentence.strip() == bad_step.text.strip():
            return None
        return sentence
