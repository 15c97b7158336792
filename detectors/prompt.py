"""`prompt`: self-assessment — the generator itself is asked whether each perception step is faithful.

The paper's weakest useful detector (F1 30.8 on the unfaithful class) but free of any extra model.
One call per perception step, each with the image.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

from faithproxy.clients.vllm import assistant_text_of
from faithproxy.detectors.base import Detector
from faithproxy.detectors.self_check_prompt import build_self_check_prompt, parse_self_check
from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode, UpstreamError
from faithproxy.faithcore.images import image_parts
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict


class SelfCheckDetector(Detector):
    name: ClassVar[str] = "prompt"
    description: ClassVar[str] = "self-assessment: the generator judges its own perception steps"

    def __init__(self, max_tokens: int = 8) -> None:
        self.max_tokens = max_tokens

    async def check(self, ctx: ChainContext, new_steps: list[Step]) -> list[Verdict]:
        if ctx.generator is None:
            raise DetectorError("the prompt detector needs the generator client", code=DetectorErrorCode.OTHER)
        started = time.perf_counter()
        prefix = [s.text for s in ctx.accepted]
        jobs = []
        for i, step in enumerate(new_steps):
            if step.kind is StepKind.PERCEPTION:
                jobs.append(self._ask(ctx, prefix + [s.text for s in new_steps[:i]], step.text))
        answers = iter(await asyncio.gather(*jobs))
        latency = time.perf_counter() - started
        verdicts = []
        for step in new_steps:
            if step.kind is not StepKind.PERCEPTION:
                verdicts.append(Verdict(Faithfulness.FAITHFUL, self.name, kind=step.kind, latency_s=latency))
                continue
            faithful = next(answers)
            verdicts.append(
                Verdict(Faithfulness.FAITHFUL if faithful else Faithfulness.UNFAITHFUL, self.name,
                        kind=step.kind, latency_s=latency)
            )
        return verdicts

    async def _ask(self, ctx: ChainContext, prefix: list[str], sentence: str) -> bool:
        assert ctx.generator is not None
        prompt = build_self_check_prompt(ctx.question, prefix, sentence)
        body: dict[str, Any] = {
            "model": ctx.model,
            "messages": [{"role": "user", "content": [*image_parts(ctx.messages), {"type": "text", "text": prompt}]}],
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "stream": False,
        }
        try:
            completion = await ctx.generator.chat(body)
        except UpstreamError as exc:
            raise DetectorError(f"self-check call failed: {exc.message}", code=DetectorErrorCode.CONNECTION) from exc
        ctx.usage.add(completion.get("usage"))
        answer = parse_self_check(assistant_text_of(completion))
        if answer is None:
            raise DetectorError(
                "the generator's self-check reply had no FAITHFUL/UNFAITHFUL", code=DetectorErrorCode.UNPARSEABLE
            )
        return answer
