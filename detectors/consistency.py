"""`consistency`: the generator's own samples vote on each perception step; no second model.

A model that misdescribes the image by chance rarely repeats the same mistake when asked again; one that
sees the image right says the same thing most times (the idea of SelfCheckGPT and of semantic entropy,
Farquhar et al., Nature 2024). For each perception step the generator is asked, in ONE request, for `k`
continuations of the chain text that ends just before the step (`n = k`, temperature > 0: vLLM's prefix
cache serves the shared prompt once). The samples of a prefix are kept for the request, so a rewrite of
the step is checked against the very samples that flagged it.

The request is seeded with the step's index (`consistency_seeded`, on by default). With one seed per
position every step is sampled with the same random numbers, so the share of samples that leave the
step's claim reads the model's confidence in it with less noise: on development seed 997, 8 seeded
samples separated false steps from true ones better than 16 unseeded ones
(benchmarks/results/consistency/signal-997*.json). The cost of it: on vLLM's CPU backend (0.32) a
seeded request whose prefill is split across engine steps kills the engine ("CPU Generator does not use
offset"), seen here with 16 samples at 8 chains at once and never with 8; turn seeding off there.

Each sample is cut into sentences and read by a claim reader (detectors/claim_readers.py: by meaning,
not by string).

The step's score is the share of samples that do NOT support its claim, where a sample supports it when
ANY of its sentences makes the same claim: a model that lists the objects in another order still names
the same objects, which comparing first sentences alone would count as disagreement. The score is
P(unfaithful)-like; a step at or above the threshold (per request `X-Faithproxy-Consistency-Threshold`,
else `FAITHPROXY_CONSISTENCY_THRESHOLD`) is UNFAITHFUL. A calibration file
(`FAITHPROXY_CONSISTENCY_CALIBRATION`, written by benchmarks/evaluation/consistency_calibrate.py) maps the raw
share to a calibrated probability first, so the threshold reads as one.

Samples whose sentences make no claim at all (the sample went straight to reasoning) carry no vote: the
share is over the samples that do. A step none of them speaks to is UNKNOWN (`unchecked`: `no_votes`).
The samples' tokens are the check's usage; the verdict's reason says how many samples agreed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from faithproxy.clients.vllm import choice_texts
from faithproxy.detectors.base import Detector
from faithproxy.detectors.claim_readers import ClaimReader, claim_reader
from faithproxy.detectors.features import capture_texts, continuation_body
from faithproxy.detectors.options import DetectorOption, probability
from faithproxy.faithcore.context import CheckResult, RequestView, Usage
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode, UpstreamError
from faithproxy.faithcore.segmenter import segment_text
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict

if TYPE_CHECKING:
    from faithproxy.clients.vllm import VLLMClient
    from faithproxy.detectors.base import DetectorDeps

THRESHOLD_OPTION = "consistency_threshold"  # RequestView.options key
_MEMO_SIZE = 4096  # prefixes whose samples are kept (a rewrite's check reads its step's samples again)


@dataclass(frozen=True)
class Calibration:
    """Platt scaling of the raw disagreement share: P = 1 / (1 + exp(-(a * share + b)))."""

    a: float
    b: float

    def __call__(self, share: float) -> float:
        import math

        return 1.0 / (1.0 + math.exp(-(self.a * share + self.b)))

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(float(data["a"]), float(data["b"]))


@dataclass
class _Samples:
    """The claims of each sample from one prefix, and the claims flagged there (a rewrite must beat
    every other alternative the samples hold, not only the flagged claim)."""

    claims: list[set[Hashable]]
    flagged: set[Hashable] = field(default_factory=set)


@dataclass(frozen=True)
class Vote:
    claim: Hashable
    agree: int  # samples that support the step's claim
    voters: int  # samples that made any claim
    best_other: int  # the most samples any other claim (not a flagged one) has
    samples: _Samples

    @property
    def share_against(self) -> float:
        return 1.0 - self.agree / self.voters


class ConsistencyDetector(Detector):
    """Flags a perception step most of the generator's own samples do not support."""

    name: ClassVar[str] = "consistency"
    description: ClassVar[str] = "generator self-consistency: k samples from the same prefix vote on each step"
    options: ClassVar[tuple[DetectorOption, ...]] = (
        DetectorOption(
            THRESHOLD_OPTION,
            "x-faithproxy-consistency-threshold",
            probability,
            "a probability from 0 to 1",
            setting="consistency_threshold",  # the detector holds the server's value from its build
        ),
    )

    def __init__(
        self,
        generator: VLLMClient | None,
        reader: ClaimReader,
        *,
        samples: int = 8,
        temperature: float = 1.0,
        max_tokens: int = 32,
        threshold: float = 0.25,
        calibration: Calibration | None = None,
        seeded: bool = True,
    ) -> None:
        if samples < 2:
            raise ValueError("consistency samples must be >= 2")
        self.generator = generator
        self.reader = reader
        self.samples = samples
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.threshold = threshold
        self.calibration = calibration
        self.seeded = seeded
        self._memo: OrderedDict[tuple[str, str], _Samples] = OrderedDict()
        self.requests = 0  # sampling requests sent (n = samples each); memo hits send none

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> ConsistencyDetector | None:
        if deps.generator is None:
            return None  # nothing to sample from: the name is refused per request
        c = deps.consistency
        calibration = Calibration.load(c["calibration"]) if c.get("calibration") else None
        return cls(
            deps.generator,
            claim_reader(c.get("claims", "words")),
            samples=c.get("samples", 8),
            temperature=c.get("temperature", 1.0),
            max_tokens=c.get("max_tokens", 32),
            threshold=c.get("threshold", 0.25),
            calibration=calibration,
            seeded=c.get("seeded", True),
        )

    def probability(self, vote: Vote) -> float:
        share = vote.share_against
        return self.calibration(share) if self.calibration is not None else share

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        if self.generator is None:
            raise DetectorError("the consistency detector needs the generator client", code=DetectorErrorCode.OTHER)
        started = time.perf_counter()
        threshold = view.options.get(THRESHOLD_OPTION, self.threshold)
        prefix, pieces = capture_texts(view.accepted, new_steps, view.reasoning_format)
        usage = Usage()
        todo = [i for i, s in enumerate(new_steps) if s.kind is StepKind.PERCEPTION]
        befores = [(prefix + "".join(pieces[:i])).rstrip() for i in todo]
        votes = await asyncio.gather(
            *(self._vote(view, before, new_steps[i], usage) for i, before in zip(todo, befores, strict=True))
        )
        by_step = dict(zip(todo, votes, strict=True))
        latency = time.perf_counter() - started
        verdicts = []
        for i, step in enumerate(new_steps):
            vote = by_step.get(i)
            if step.kind is not StepKind.PERCEPTION:
                verdicts.append(Verdict(Faithfulness.FAITHFUL, self.name, kind=step.kind, latency_s=latency))
            elif vote is None or vote.voters == 0:
                verdicts.append(
                    Verdict(Faithfulness.UNKNOWN, self.name, kind=step.kind, latency_s=latency, unchecked="no_votes")
                )
            else:
                verdicts.append(self._verdict(view, step, vote, threshold, latency))
        return CheckResult(tuple(verdicts), usage)

    def _verdict(self, view: RequestView, step: Step, vote: Vote, threshold: float, latency: float) -> Verdict:
        """A draft is flagged at the threshold. A rewrite of a flagged step is checked against the same
        samples by another rule: it passes when no other claim (the flagged one aside) has more samples
        behind it. The threshold cannot be the rule there: a step flagged at 3 of 8 samples against
        still has 5 of 8 behind it, so any alternative has at most 3, and no rewrite would ever pass."""
        p = self.probability(vote)
        reason = f"{vote.agree} of {vote.voters} samples agree"
        if view.rewrite and vote.samples.flagged:
            faithful = vote.agree >= max(1, vote.best_other)
            reason += f"; rewrite, best alternative {vote.best_other}"
        else:
            faithful = p < threshold
            if not faithful:
                vote.samples.flagged.add(vote.claim)
        return Verdict(
            Faithfulness.FAITHFUL if faithful else Faithfulness.UNFAITHFUL,
            self.name,
            kind=step.kind,
            reason=reason,
            latency_s=latency,
            score=round(p, 4),
        )

    async def _vote(self, view: RequestView, before: str, step: Step, usage: Usage) -> Vote | None:
        claim = self.reader.key(step.text)
        if claim is None:
            return None  # the reader sees no claim in it: nothing to compare
        samples = await self._sampled_claims(view, before, step.index, usage)
        voters = [c for c in samples.claims if c]
        support = Counter(c for sample in voters for c in sample)
        others = [n for c, n in support.items() if c != claim and c not in samples.flagged]
        return Vote(claim, support[claim], len(voters), max(others, default=0), samples)

    async def _sampled_claims(self, view: RequestView, before: str, index: int, usage: Usage) -> _Samples:
        """The claims of each of the k samples from `before` (memoised per request and prefix)."""
        key = (view.request_id, before)
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        assert self.generator is not None
        body = continuation_body(view, before, n=self.samples, temperature=self.temperature, max_tokens=self.max_tokens)
        if self.seeded:
            body["seed"] = index
        try:
            completion = await self.generator.chat(body)
        except UpstreamError as exc:
            raise DetectorError(
                f"consistency sampling failed: {exc.message}", code=DetectorErrorCode.CONNECTION
            ) from exc
        self.requests += 1
        usage.add(completion.get("usage"))
        claims = []
        for text in choice_texts(completion):
            found = {self.reader.key(s.text) for s in segment_text(text) if s.text}
            found.discard(None)
            claims.append(found)
        samples = self._memo[key] = _Samples(claims)
        while len(self._memo) > _MEMO_SIZE:
            self._memo.popitem(last=False)
        return samples
