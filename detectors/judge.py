"""The auxiliary-VLM judge detector (the paper's best detector: F1 97.8 on the unfaithful class).

One judge call per `check`: the accepted steps and the new steps go together as the partial chain, so
several steps finished while the judge was busy are batched into a single call. The accepted steps are
marked as context ("checked before"): they are final (emitted, or already regenerated K times), and a
judge that kept naming a residual step would leave every later step unchecked.

Mapping of the judge's reply onto the new steps:
- kind: the judge's typing of the sentence when it gave one, else the step's own (heuristic) kind;
- before the first unfaithful sentence: FAITHFUL (reasoning steps too, with kind REASONING);
- the first unfaithful sentence: UNFAITHFUL, kind PERCEPTION (the judge's verdict implies it);
- after it: UNKNOWN, reason "judge:<name>:not_reached"; the session reads them again after the correction.

If the judge still names an accepted step (it ignored the "checked before" note), the call is repeated
once with the new steps alone as the chain, which cannot point into the past. That second call is rare
and only costs when the judge misbehaves; it is logged.

The judge's image description is kept in a small LRU keyed by (judge name, image hashes) and passed
as a hint on later calls about the same image(s): successive calls of a request then start from the
same grounding.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from faithproxy.clients.judge_base import JudgeBackend, JudgeResult
from faithproxy.detectors.base import Detector
from faithproxy.detectors.judge_prompt import JUDGE_SYSTEM_PROMPT, JudgeReply, build_judge_prompt, parse_judge_reply
from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict

if TYPE_CHECKING:
    from faithproxy.detectors.registry import DetectorDeps

logger = logging.getLogger(__name__)


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

    The detector owns the backends it is given: `aclose()` closes them.
    """

    name: ClassVar[str] = "judge"
    description: ClassVar[str] = "an auxiliary VLM judges the partial chain against the image"
    types_steps: ClassVar[bool] = True
    uses_judge: ClassVar[bool] = True

    def __init__(
        self,
        judges: Mapping[str, JudgeBackend],
        default: str,
        *,
        description_cache_size: int = 256,
        describe_hint: bool = True,
    ) -> None:
        if default not in judges:
            raise ValueError(f"default judge {default!r} is not configured (have: {sorted(judges)})")
        self.judges = dict(judges)
        self.default = default
        self.describe_hint = describe_hint
        self.descriptions = DescriptionCache(description_cache_size)
        self.calls = 0
        self.input_tokens = 0
        self.output_tokens = 0

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> JudgeDetector | None:
        if not deps.judges:
            return None  # no judge configured on this server: the name is refused per request
        return cls(deps.judges, deps.default_judge or next(iter(deps.judges)))

    def backend_for(self, ctx: ChainContext) -> JudgeBackend:
        name = ctx.judge or self.default
        backend = self.judges.get(name)
        if backend is None:
            raise DetectorError(f"unknown judge {name!r}", code=DetectorErrorCode.UNKNOWN_JUDGE)
        return backend

    async def check(self, ctx: ChainContext, new_steps: list[Step]) -> list[Verdict]:
        if not new_steps:
            return []
        backend = self.backend_for(ctx)
        accepted = [step.text for step in ctx.accepted]
        sentences = accepted + [step.text for step in new_steps]
        reply, latency = await self._ask(ctx, backend, sentences, already_checked=len(accepted))
        offset = len(accepted)
        if reply.first_unfaithful is not None and reply.first_unfaithful < offset:
            logger.warning(
                "judge %s named accepted step %d of request %s; asking again about the new steps alone",
                backend.name,
                reply.first_unfaithful,
                ctx.request_id,
            )
            sentences = sentences[offset:]
            reply, again = await self._ask(ctx, backend, sentences, already_checked=0)
            latency += again
            offset = 0
        return _verdicts(reply, new_steps, offset, f"judge:{backend.name}", latency)

    async def _ask(
        self, ctx: ChainContext, backend: JudgeBackend, sentences: list[str], *, already_checked: int
    ) -> tuple[JudgeReply, float]:
        key = (backend.name, tuple(image.sha256 for image in ctx.images))
        hint = self.descriptions.get(key) if self.describe_hint and ctx.images else None
        prompt = build_judge_prompt(ctx.question, sentences, already_checked=already_checked, image_hint=hint)
        result: JudgeResult = await backend.complete(JUDGE_SYSTEM_PROMPT, prompt, ctx.images)
        self.calls += 1
        self.input_tokens += result.input_tokens
        self.output_tokens += result.output_tokens
        logger.debug(
            "judge %s: %d sentences (%d context) in %.3fs, %d+%d tokens",
            backend.name,
            len(sentences),
            already_checked,
            result.latency_s,
            result.input_tokens,
            result.output_tokens,
        )
        reply = parse_judge_reply(result.text, sentences)
        if reply.description and ctx.images:
            self.descriptions.put(key, reply.description)
        return reply, result.latency_s

    async def aclose(self) -> None:
        for backend in self.judges.values():
            await backend.aclose()


def _verdicts(reply: JudgeReply, new_steps: list[Step], offset: int, reason: str, latency_s: float) -> list[Verdict]:
    verdicts = []
    first = reply.first_unfaithful
    for i, step in enumerate(new_steps):
        position = offset + i
        kind = reply.kinds.get(position, step.kind)
        if first is None or position < first:
            faithfulness = Faithfulness.FAITHFUL
        elif position == first:
            faithfulness, kind = Faithfulness.UNFAITHFUL, StepKind.PERCEPTION
        else:
            faithfulness = Faithfulness.UNKNOWN
        why = f"{reason}:not_reached" if faithfulness is Faithfulness.UNKNOWN else reason
        verdicts.append(Verdict(faithfulness, "judge", kind=kind, reason=why, latency_s=latency_s))
    return verdicts
