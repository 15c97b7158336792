"""Hidden-state features of chain steps, read from the generator: for any detector and for traces.

Not a detector. The probe reads the features its recipe asks for; the server, when it records features
for traces (settings.record_features) and the detector reads none itself, calls `read_step_features`
beside the check, so that probes can be trained from traces whose steps carry a judge's verdicts.

The chain text a capture ends at must be the text the model wrote, think markers included: `chain_text`
puts back what a reasoning parser took out, `capture_texts` cuts it into one piece per step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.faithcore.reasoning_formats import ReasoningFormat, get_format
from faithproxy.faithcore.types import Channel, Step, StepKind

if TYPE_CHECKING:
    from faithproxy.clients.hidden_states import Features, HiddenStatesClient

logger = logging.getLogger(__name__)


def chain_text(steps: Sequence[Step], fmt: ReasoningFormat | None = None) -> str:
    """The partial assistant message that makes vLLM render `steps` exactly as the model wrote them.

    A reasoning parser moved thinking steps into `reasoning` and dropped the think markers: they are put
    back as the reasoning format says (`ReasoningFormat.model_text`: the opening marker only when the
    model writes it itself, the closing one before the answer). When the generation prompt opens the
    think block (`think_prompt`), a partial assistant message replaces that prompt's tail, so the
    opening marker is written back as the template wrote it; Qwen3's template (`qwen3`) re-renders the
    message with a think block of its own, so nothing is added there. Default format: `think`.
    """
    fmt = fmt or get_format("think")
    by_channel: dict[Channel, str] = {}
    for step in steps:
        by_channel[step.channel] = by_channel.get(step.channel, "") + step.raw
    text = fmt.model_text(by_channel)
    if fmt.prompt_opens_think and not fmt.rewraps_final_message and text:
        text = fmt.think_open + "\n" + text
    return text


def capture_texts(
    accepted: Sequence[Step], new_steps: Sequence[Step], fmt: ReasoningFormat | None
) -> tuple[str, list[str]]:
    """(prefix, pieces) for `HiddenStatesClient.step_states`: prefix + pieces[:i+1] is the chain text
    that ends at new step i, markers included, even when the first new step is the chain's first."""
    texts = [chain_text(accepted, fmt)]
    for k in range(1, len(new_steps) + 1):
        texts.append(chain_text([*accepted, *new_steps[:k]], fmt))
    if texts[0] == "" and new_steps:
        # the opening marker, if any, belongs in front of the first step: keep it in the prefix so that
        # the pieces are the steps' own text (the capture of step i ends at its last character)
        first = new_steps[0].raw
        opening = texts[1][: len(texts[1]) - len(first)] if texts[1].endswith(first) else ""
        texts[0] = opening
    pieces = []
    for before, after in zip(texts, texts[1:], strict=False):
        if not after.startswith(before):  # steps out of channel order: fall back to the raw text
            return texts[0], [step.raw for step in new_steps]
        pieces.append(after[len(before) :])
    return texts[0], pieces


async def read_step_features(
    hidden: HiddenStatesClient, view: RequestView, steps: Sequence[Step]
) -> tuple[Features | None, ...]:
    """The `last_token` features of each perception step of `steps` that has none yet (None for the
    others), for the trace. Nothing is written onto the steps: the driver puts them there. A failed
    capture is logged and leaves every step without (a trace without features is still a trace)."""
    from faithproxy.clients.hidden_states import Features

    none: tuple[Features | None, ...] = (None,) * len(steps)
    todo = [i for i, s in enumerate(steps) if s.kind is StepKind.PERCEPTION and s.features is None]
    if not todo:
        return none
    prefix, pieces = capture_texts(view.accepted, steps[: todo[-1] + 1], view.reasoning_format)
    try:
        captured = await hidden.step_states(view.model, view.messages, prefix, pieces, todo)
    except FaithproxyError as exc:
        logger.warning("request %s: no features recorded: %s", view.request_id, exc.message)
        return none
    return tuple(Features.last_token(captured[i]) if i in captured else None for i in range(len(steps)))


def continuation_body(view: RequestView, before: str, *, n: int, temperature: float, max_tokens: int) -> dict[str, Any]:
    """A non-streamed request for `n` sampled continuations of the chain text `before` (markers
    included): the request's messages with `before` as the partial assistant message."""
    return {
        "model": view.model,
        "messages": [*view.messages, {"role": "assistant", "content": before}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "n": n,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "stream": False,
    }
