"""`reflect`: the generator rewrites its own flagged step, looking at the image again (paper, Table 16).

A try whose rewrite is the flagged sentence again, or a rewrite the detector already rejected, is a
wasted detector call and a wasted try. Small models do this a lot: asked to recount, they recount to
the same wrong number. So a sampled try asks vLLM for `samples` rewrites in one request (`n`) and
takes the one most of them agree on among those not seen yet (ties: the earliest), as in
self-consistency decoding; the detector still checks every candidate it is given. With `insist_share`
set, samples that mostly restate the flagged sentence end the correction of that step (see the class).
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
    """`insist_share` (None: off): when at least that share of a sampled try's rewrites restate the
    flagged sentence, the try reports that the model insists (`Regeneration.insisted`) instead of a
    candidate, and the correction keeps the step (residual, reason `insisted`) without spending its
    other tries: the generator is sure where the detector flagged it, as with a judge's false flag."""

    name: ClassVar[str] = "reflect"

    def __init__(
        self,
        generator: VLLMClient,
        *,
        temperature: float = 0.8,
        max_tokens: int = 128,
        samples: int = 8,
        insist_share: float | None = None,
    ) -> None:
        if samples < 1:
            raise ValueError("samples must be >= 1")
        if insist_share is not None and not 0.0 < insist_share <= 1.0:
            raise ValueError("insist_share must be in (0, 1]")
        self.generator = generator
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.samples = samples
        self.insist_share = insist_share

    async def regenerate(self, view: RequestView, prefix: list[str], bad_step: Step, attempt: int) -> Regeneration:
        """A rewrite that is neither the flagged sentence nor one rejected before, or None; with the
        tokens of every call the try made."""
        seen = {bad_step.text.strip(), *(r.strip() for r in bad_step.rejected)}
        body = self._body(view, prefix, bad_step)
        usage = Usage()
        if attempt == 1 or self.temperature <= 0:
            candidate = _most_agreed_new(await self._rewrites(body | {"temperature": 0.0}, usage), seen)
            if candidate is not None or self.temperature <= 0:
                return Regeneration(candidate, usage)
        rewrites = await self._rewrites(body | self._sampled(attempt), usage)
        if self.insist_share is not None and restated_share(rewrites, bad_step.text) >= self.insist_share:
            return Regeneration(None, usage, insisted=True)
        return Regeneration(_most_agreed_new(rewrites, seen), usage)

    def _sampled(self, attempt: int) -> dict[str, Any]:
        # vLLM seeds the n samples of one request seed, seed + 1, ...: spacing the tries' seeds by n
        # keeps every sample of every try distinct and the whole retry sequence reproducible.
        return {"temperature": self.temperature, "n": self.samples, "seed": attempt * self.samples}

    async def sampled_rewrites(
        self, view: RequestView, prefix: list[str], bad_step: Step, attempt: int
    ) -> list[str | None]:
        """The rewrites a sampled try `attempt` reads, exactly as `regenerate` asks for them: what the
        insist rule is measured on (benchmarks/evaluation/insist_bench.py)."""
        return await self._rewrites(self._body(view, prefix, bad_step) | self._sampled(attempt), Usage())

    def _body(self, view: RequestView, prefix: list[str], bad_step: Step) -> dict[str, Any]:
        prompt = build_regeneration_prompt(view.question, prefix, bad_step.text)
        return {
            "model": view.model,
            "messages": [{"role": "user", "content": [*image_parts(view.messages), {"type": "text", "text": prompt}]}],
            "max_tokens": self.max_tokens,
            "stream": False,
        }

    async def _rewrites(self, body: dict[str, Any], usage: Usage) -> list[str | None]:
        """One call's rewrites (None: a reply without one); its tokens go into `usage`, the try's tally."""
        try:
            completion = await self.generator.chat(body)
        except UpstreamError as exc:
            raise RegenerationError(f"regeneration call failed: {exc.message}", code=exc.code) from exc
        usage.add(completion.get("usage"))
        return [parse_bracketed(text) for text in choice_texts(completion)]


def _most_agreed_new(rewrites: list[str | None], seen: set[str]) -> str | None:
    """The rewrite most samples agree on among those not seen; spellings that differ only in case or
    spacing are one rewrite (and one seen before is not new: checking it again would waste a judge
    call). The earliest spelling of the winner is returned."""
    old = {_key(s) for s in seen}
    votes: Counter[str] = Counter()
    spelling: dict[str, str] = {}
    for sentence in rewrites:
        if sentence and _key(sentence) not in old:
            votes[_key(sentence)] += 1
            spelling.setdefault(_key(sentence), sentence)
    return spelling[max(votes, key=votes.__getitem__)] if votes else None  # max keeps the earliest of a tie


def _key(sentence: str) -> str:
    return " ".join(sentence.split()).casefold()


def _same(a: str, b: str) -> bool:
    return _key(a) == _key(b)


def restated_share(rewrites: list[str | None], flagged: str) -> float:
    """The share of the samples that restate the flagged sentence (case and spacing aside)."""
    return sum(1 for r in rewrites if r and _same(r, flagged)) / len(rewrites) if rewrites else 0.0
