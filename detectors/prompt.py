"""`prompt`: self-assessment — the generator itself is asked whether each perception step is faithful.

The paper's weakest useful detector (F1 30.8 on the unfaithful class) but free of any extra model.
One call per perception step, each with the image. The generator's client is handed over when the
detector is built (DetectorDeps.generator); the tokens its calls spend come back in the CheckResult.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from faithproxy.clients.vllm import assistant_text_of
from faithproxy.detectors.base import Detector
from faithproxy.detectors.self_check_prompt import build_self_check_prompt, parse_self_check
from faithproxy.faithcore.context import CheckResult, RequestView, Usage
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode, UpstreamError
from faithproxy.faithcore.images import image_parts
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict

if TYPE_CHECKING:
    from faithproxy.clients.vllm import VLLMClient
    from faithproxy.detectors.base import DetectorDeps


class SelfCheckDetector(Detector):
    name: ClassVar[str] = "prompt"
    description: ClassVar[str] = "self-assessment: the generator judges its own perception steps"

    def __init__(self, generator: VLLMClient | None = None, max_tokens: int = 8) -> None:
        self.generator = generator
        self.max_tokens = max_tokens

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> SelfCheckDetector:
        # Built without a generator too (replay of a detector that never calls it, a listing): its
        # check then fails as a detector error, as before the client was injected.
        return cls(deps.generator)

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        if self.generator is None:
            raise DetectorError("the prompt detector needs the generator client", code=DetectorErrorCode.OTHER)
        started = time.perf_counter()
        prefix = [s.text for s in view.accepted]
        usage = Usage()
        jobs = []
        for i, step in enumerate(new_steps):
            if step.kind is StepKind.PERCEPTION:
                jobs.append(self._ask(view, prefix + [s.text for s in new_steps[:i]], step.text, usage))
        answers = iter(await asyncio.gather(*jobs))
        latency = time.perf_counter() - started
        verdicts = []
        for step in new_steps:
            if step.kind is not StepKind.PERCEPTION:
                verdicts.append(Verdict(Faithfulness.FAITHFUL, self.name, kind=step.kind, latency_s=latency))
                continue
            faithful = next(answers)
            verdicts.append(
                Verdict(
                    Faithfulness.FAITHFUL if faithful else Faithfulness.UNFAITHFUL,
                    self.name,
                    kind=step.kind,
                    latency_s=latency,
                )
            )
        return CheckResult(tuple(verdicts), usage)

    async def _ask(self, view: RequestView, prefix: list[str], sentence: str, usage: Usage) -> bool:
        """One self-check call; its tokens go into `usage`, this check's own tally."""
        assert self.generator is not None
        prompt = build_self_check_prompt(view.question, prefix, sentence)
        body: dict[str, Any] = {
            "model": view.model,
            "messages": [{"role": "user", "content": [*image_parts(view.messages), {"type": "text", "text": prompt}]}],
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "stream": False,
        }
        try:
            completion = await self.generator.chat(body)
        except UpstreamError as exc:
            raise DetectorError(f"self-check call failed: {exc.message}", code=DetectorErrorCode.CONNECTION) from exc
        usage.add(completion.get("usage"))
        answer = parse_self_check(assistant_text_of(completion))
        if answer is None:
            raise DetectorError(
                "the generator's self-check reply had no FAITHFUL/UNFAITHFUL", code=DetectorErrorCode.UNPARSEABLE
            )
        return answer
