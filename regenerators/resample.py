"""`resample`: the rewrite of a flagged step is what the generator's own samples say most often instead.

The consistency detector flags a step most of the generator's samples from the same prefix do not
support; the claim those samples make most often, the flagged one aside, is the natural rewrite (the
majority vote of self-consistency decoding), and it needs no reflection prompt the model may never have
seen. Each try asks for `samples` continuations of the chain text that ends before the flagged step (one
request, `n`), reads each sample's first sentence with the claim reader (`consistency_claims`), drops
the flagged claim and every rejected one, and returns the first spelling of the claim most samples make.
Sampling runs at `temperature` (at least 1.0: the flagged claim is the greedy one, so a cooler sampler
mostly repeats it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import ClassVar

from faithproxy.clients.vllm import VLLMClient, choice_texts
from faithproxy.detectors.claim_readers import ClaimReader, claim_reader
from faithproxy.detectors.features import capture_texts, continuation_body
from faithproxy.faithcore.context import Regeneration, RequestView, Usage
from faithproxy.faithcore.errors import RegenerationError, UpstreamError
from faithproxy.faithcore.segmenter import segment_text
from faithproxy.faithcore.types import Step
from faithproxy.regenerators.base import Regenerator


class ResampleRegenerator(Regenerator):
    """The most sampled alternative claim (see the module docstring)."""

    name: ClassVar[str] = "resample"
    reads_claims: ClassVar[bool] = True  # built with the `consistency_claims` reader

    def __init__(
        self,
        generator: VLLMClient,
        *,
        temperature: float = 1.0,
        max_tokens: int = 48,
        samples: int = 8,
        insist_share: float | None = None,
        claims: str | ClaimReader = "words",
    ) -> None:
        del insist_share  # the samples decide; an insisting model simply offers no alternative
        self.generator = generator
        self.temperature = max(temperature, 1.0)
        self.max_tokens = min(max_tokens, 48)  # the first sentence is all that is read
        self.samples = samples
        self.reader = claim_reader(claims) if isinstance(claims, str) else claims

    async def regenerate(self, view: RequestView, prefix: list[str], bad_step: Step, attempt: int) -> Regeneration:
        before, _ = capture_texts(view.accepted, [bad_step], view.reasoning_format)
        body = continuation_body(
            view, before.rstrip(), n=self.samples, temperature=self.temperature, max_tokens=self.max_tokens
        )
        usage = Usage()
        try:
            completion = await self.generator.chat(body)
        except UpstreamError as exc:
            raise RegenerationError(f"resampling failed: {exc.message}", code=exc.code) from exc
        usage.add(completion.get("usage"))
        refused = {self.reader.key(text) for text in (bad_step.text, *bad_step.rejected)}
        votes: Counter[Hashable] = Counter()
        spelling: dict[Hashable, str] = {}
        for text in choice_texts(completion):
            first = next((s.text for s in segment_text(text) if s.text), None)
            claim = self.reader.key(first) if first else None
            if claim is None or claim in refused:
                continue
            votes[claim] += 1
            spelling.setdefault(claim, first)  # type: ignore[arg-type]
        if not votes:
            return Regeneration(None, usage)
        return Regeneration(spelling[max(votes, key=votes.__getitem__)], usage)
