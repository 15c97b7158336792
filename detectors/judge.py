"""The auxiliary-VLM judge detector (the paper's best detector: F1 97.8 on the unfaithful class).

One judge call per `check`, about the NEW steps only: the accepted steps go along as context (they are
final: emitted, or already regenerated K times), so several steps finished while the judge was busy are
batched into one call, and the judge's reply grows with the new steps, never with the chain. The
protocol, its prompt layout for prefix caching and what it changed from the paper are in
`judge_prompt.py` and docs/judge.md.

Mapping of the judge's reply onto the new steps:
- kind: the judge's typing of the sentence when it gave one, else the step's own (heuristic) kind;
- before the first unfaithful sentence: FAITHFUL (reasoning steps too, with kind REASONING);
- the first unfaithful sentence: UNFAITHFUL, kind PERCEPTION (the judge's verdict implies it);
- after it: UNKNOWN, reason "judge:<name>:not_reached"; the session reads them again after the correction.

If the judge still names an accepted step (it ignored "context only"), the call is repeated once with
the new steps alone as the chain, which cannot point into the past. That second call is rare and only
costs when the judge misbehaves; it is logged.

Per request (view.judge_state, which lives and dies with the request): the judge's image description,
asked for in the first call that has images and then part of every later prompt, never asked for again;
the places earlier prompts cut the chain into blocks (so later prompts share their prefix, block for
block); and the bill, every call's tokens and the calls themselves. Across requests a small LRU keyed by
(judge name, image hashes) remembers descriptions, so a new request about an image already described
starts with that description instead of asking for another.

Budget: with `judge_budget_tokens` in view.options (header X-Faithproxy-Judge-Budget, at most the
server's FAITHPROXY_JUDGE_BUDGET_TOKENS), once the request's judge tokens (fresh input, cache
writes and output; cache reads are free here) reach it, no further call is made: the new steps come back
UNKNOWN with `unchecked="budget"`, and the request goes on.

Confidence: a flag's P(UNFAITHFUL) from the reply's log-probabilities (judge_confidence.py). A judge
that gives none (Anthropic) may be given `samples` n (FAITHPROXY_JUDGE_SAMPLES): a flag is then asked
n - 1 more times with the same prompt, and the share of the n replies naming the same sentence is its
confidence (self-consistency; it needs a judge that samples, temperature above 0). Without either the
confidence is unknown and a flag threshold does not apply.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from faithproxy.clients.judge_base import JudgeBackend, JudgeResult, UserTurn
from faithproxy.detectors.base import Detector
from faithproxy.detectors.judge_confidence import flag_confidence
from faithproxy.detectors.judge_prompt import (
    JUDGE_SYSTEM_PROMPT,
    JudgeReply,
    build_judge_turn,
    chain_cuts,
    parse_judge_reply,
)
from faithproxy.detectors.options import DetectorOption, probability, whole_number
from faithproxy.faithcore.context import CheckResult, JudgeState, JudgeUsage, RequestView
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict

if TYPE_CHECKING:
    from faithproxy.detectors.base import DetectorDeps

logger = logging.getLogger(__name__)

BUDGET_OPTION = "judge_budget_tokens"  # the RequestView.options key of a request's judge budget
BUDGET_REASON = "budget"  # Verdict.unchecked of the steps the budget let through
THRESHOLD_OPTION = "flag_threshold"  # the RequestView.options key of a request's flag threshold
UNSURE_REASON = "unsure"  # ends the reason of a flag under the threshold


class DescriptionCache:
    """A bounded LRU of image descriptions, keyed by (judge name, image sha256s)."""

    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, tuple[str, ...]], str] = OrderedDict()

    def get(self, key: tuple[str, tuple[str, ...]]) -> str | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: tuple[str, tuple[str, ...]], value: str) -> None:
        if self.max_entries <= 0:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class JudgeDetector(Detector):
    """Asks a server-configured judge VLM (chosen per request by name) for the first unfaithful step.

    The detector owns the backends it is given: `aclose()` closes them. `usage` adds up every call it
    made, over all requests (the offline replay reads it).
    """

    name: ClassVar[str] = "judge"
    description: ClassVar[str] = "an auxiliary VLM judges the partial chain against the image"
    types_steps: ClassVar[bool] = True
    uses_judge: ClassVar[bool] = True
    options: ClassVar[tuple[DetectorOption, ...]] = (
        DetectorOption(
            BUDGET_OPTION,
            "x-faithproxy-judge-budget",
            whole_number(10**12),
            "a whole number of judge tokens (0 or more; 0 checks nothing with the judge)",
            setting="judge_budget_tokens",
            setting_is_default=True,
            ceiling="asks for {value} judge tokens, more than this server allows a request ({limit})",
        ),
        DetectorOption(
            THRESHOLD_OPTION,
            "x-faithproxy-flag-threshold",
            probability,
            "a probability from 0 to 1 (a flag the judge is less sure of is delivered unsure, not rewritten)",
        ),
    )

    def __init__(
        self,
        judges: Mapping[str, JudgeBackend],
        default: str,
        *,
        description_cache_size: int = 256,
        samples: Mapping[str, int] | None = None,
    ) -> None:
        if default not in judges:
            raise ValueError(f"default judge {default!r} is not configured (have: {sorted(judges)})")
        samples = dict(samples or {})
        unknown = sorted(set(samples) - set(judges))
        if unknown or any(n < 2 for n in samples.values()):
            raise ValueError(f"judge samples: each must name a configured judge and be at least 2 (got {samples})")
        self.judges = dict(judges)
        self.default = default
        # Self-consistency (judges without log-probabilities): a flag is asked n times in all, and the
        # share of replies naming the same sentence is its confidence.
        self.samples = samples
        self.descriptions = DescriptionCache(description_cache_size)
        self.usage = JudgeUsage()

    @property
    def calls(self) -> int:
        return self.usage.calls

    @property
    def input_tokens(self) -> int:
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.usage.output_tokens

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> JudgeDetector | None:
        if not deps.judges:
            return None  # no judge configured on this server: the name is refused per request
        return cls(deps.judges, deps.default_judge or next(iter(deps.judges)), samples=deps.judge_samples)

    def backend_for(self, view: RequestView) -> JudgeBackend:
        name = view.judge or self.default
        backend = self.judges.get(name)
        if backend is None:
            raise DetectorError(f"unknown judge {name!r}", code=DetectorErrorCode.UNKNOWN_JUDGE)
        return backend

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        if not new_steps:
            return CheckResult(())
        backend = self.backend_for(view)
        reason = f"judge:{backend.name}"
        threshold = flag_threshold(view, backend)
        accepted = [step.text for step in view.accepted]
        verdicts: list[Verdict] = []
        remaining = list(new_steps)
        while remaining:  # again after each unsure flag: the judge stopped there, the rest is unread
            if over_budget(view):
                verdicts += _passed_for_budget(view, remaining, reason)
                break
            part = await self._judge(view, backend, accepted, remaining, reason, threshold)
            unsure = next((i for i, v in enumerate(part) if v.faithfulness is Faithfulness.UNSURE), None)
            if unsure is None:
                verdicts += part
                break
            verdicts += part[: unsure + 1]
            accepted += [step.text for step in remaining[: unsure + 1]]
            remaining = remaining[unsure + 1 :]
        return CheckResult(tuple(verdicts))

    async def _judge(
        self,
        view: RequestView,
        backend: JudgeBackend,
        accepted: list[str],
        new_steps: list[Step],
        reason: str,
        threshold: float | None,
    ) -> list[Verdict]:
        """One judge call about `new_steps` (two when the judge names an accepted step), as verdicts."""
        sentences = accepted + [step.text for step in new_steps]
        reply, latency, confidence = await self._ask(view, backend, sentences, already_checked=len(accepted))
        offset = len(accepted)
        if reply.first_unfaithful is not None and reply.first_unfaithful < offset:
            logger.warning(
                "judge %s named accepted step %d of request %s; asking again about the new steps alone",
                backend.name,
                reply.first_unfaithful,
                view.request_id,
            )
            sentences = sentences[offset:]
            reply, again, confidence = await self._ask(view, backend, sentences, already_checked=0, stable=False)
            latency += again
            offset = 0
        unsure = confidence is not None and threshold is not None and confidence < threshold
        return _verdicts(reply, new_steps, offset, reason, latency, confidence, unsure=unsure)

    async def _ask(
        self,
        view: RequestView,
        backend: JudgeBackend,
        sentences: list[str],
        *,
        already_checked: int,
        stable: bool = True,
    ) -> tuple[JudgeReply, float, float | None]:
        """One call: the reply, its latency and the judge's confidence in its flag (None: no flag, or
        unknown). `stable`: the chain starts at sentence 1 of the request (not the fallback's slice),
        so its cuts are the request's and are remembered for the next prompt."""
        state = view.judge_state
        key = (backend.name, tuple(image.sha256 for image in view.images))
        if view.images and state.description is None:
            state.description = self.descriptions.get(key)  # the same image(s) in an earlier request
        ask = bool(view.images) and state.description is None
        splits = state.splits if stable else set()
        blocks = build_judge_turn(
            view.question,
            sentences,
            already_checked=already_checked,
            description=state.description,
            ask_description=ask,
            splits=splits,
        )
        if stable:
            state.splits.update(chain_cuts(len(sentences), already_checked, splits))
        result: JudgeResult = await backend.complete(JUDGE_SYSTEM_PROMPT, blocks, list(view.images))
        self._bill(state, backend, result)
        logger.debug(
            "judge %s: %d sentences (%d context) in %.3fs; tokens in %d, cached %d, cache-written %d, out %d",
            backend.name,
            len(sentences),
            already_checked,
            result.latency_s,
            result.input_tokens,
            result.cached_input_tokens,
            result.cache_creation_tokens,
            result.output_tokens,
        )
        reply = parse_judge_reply(result.text, sentences)
        if ask and reply.description and " ".join(reply.description.split()):
            state.description = " ".join(reply.description.split())
            state.descriptions += 1
            self.descriptions.put(key, state.description)
        confidence = flag_confidence(result.tokens) if reply.first_unfaithful is not None else None
        latency = result.latency_s
        n = self.samples.get(backend.name, 1)
        if confidence is None and reply.first_unfaithful is not None and n > 1:
            confidence, extra = await self._agreement(view, backend, blocks, sentences, reply.first_unfaithful, n)
            latency += extra
        return reply, latency, confidence

    def _bill(self, state: JudgeState, backend: JudgeBackend, result: JudgeResult) -> None:
        call = result.usage()
        self.usage.add(call)
        state.record(backend.name, call)

    async def _agreement(
        self,
        view: RequestView,
        backend: JudgeBackend,
        blocks: UserTurn,
        sentences: list[str],
        flagged: int,
        n: int,
    ) -> tuple[float, float]:
        """Self-consistency: the same prompt asked n - 1 more times, at once; the share of all n replies
        that name the same first unfaithful sentence (the first reply counts), and the time it took.
        Every call is billed like any other."""
        started = time.perf_counter()
        results = await asyncio.gather(
            *(backend.complete(JUDGE_SYSTEM_PROMPT, blocks, list(view.images)) for _ in range(n - 1))
        )
        agree = 1
        for result in results:
            self._bill(view.judge_state, backend, result)
            agree += parse_judge_reply(result.text, sentences).first_unfaithful == flagged
        return agree / n, time.perf_counter() - started

    async def aclose(self) -> None:
        for backend in self.judges.values():
            await backend.aclose()


def flag_threshold(view: RequestView, backend: JudgeBackend) -> float | None:
    """The request's threshold on a flag's confidence: the higher of the judge's configured
    `flag_threshold` and the request's header (a request may be stricter than the operator, not
    laxer); None: every flag is acted on."""
    values = [v for v in (backend.config.flag_threshold, view.options.get(THRESHOLD_OPTION)) if v is not None]
    return max(values) if values else None


def over_budget(view: RequestView) -> bool:
    """Whether the request's judge budget (if it has one) is spent."""
    budget = view.options.get(BUDGET_OPTION)
    return budget is not None and view.judge_state.usage.budget_tokens >= int(budget)


def _passed_for_budget(view: RequestView, new_steps: list[Step], reason: str) -> tuple[Verdict, ...]:
    # the judge's own memo of the request (JudgeState), not the view: it counts what its budget let by
    view.judge_state.budget_steps += sum(1 for step in new_steps if step.kind is StepKind.PERCEPTION)
    return tuple(
        Verdict(
            Faithfulness.UNKNOWN,
            "judge",
            kind=step.kind,
            reason=f"{reason}:{BUDGET_REASON}",
            unchecked=BUDGET_REASON,
        )
        for step in new_steps
    )


def _verdicts(
    reply: JudgeReply,
    new_steps: list[Step],
    offset: int,
    reason: str,
    latency_s: float,
    confidence: float | None,
    *,
    unsure: bool = False,
) -> list[Verdict]:
    """The reply as one verdict per new step; with `unsure` the flag (its confidence under the request's
    threshold) is UNSURE, and the steps after it are left for the caller to ask about again."""
    verdicts = []
    first = reply.first_unfaithful
    for i, step in enumerate(new_steps):
        position = offset + i
        kind = reply.kinds.get(position, step.kind)
        if first is None or position < first:
            faithfulness = Faithfulness.FAITHFUL
        elif position == first:
            faithfulness = Faithfulness.UNSURE if unsure else Faithfulness.UNFAITHFUL
            kind = StepKind.PERCEPTION
        else:
            faithfulness = Faithfulness.UNKNOWN
        why = {Faithfulness.UNKNOWN: f"{reason}:not_reached", Faithfulness.UNSURE: f"{reason}:{UNSURE_REASON}"}.get(
            faithfulness, reason
        )
        sure = confidence if position == first else None
        verdicts.append(Verdict(faithfulness, "judge", kind=kind, reason=why, latency_s=latency_s, confidence=sure))
    return verdicts
