"""A door's wires to vLLM: how its verified rounds talk to vLLM (`RoundWire`), and how the shadow check
reads the response its off mode passed through (`ShadowReader`). A door carries both (`Door.round_wire`,
`Door.shadow_reader`); a door without a round wire runs its rounds as chat (server/chain/session.py
`CHAT_WIRE`), and one without a shadow reader is never sampled for a shadow check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: a server that only passes requests through never loads the machine
    from faithproxy.faithcore.correction import Delta, Extras, RoundEnd, StartRound
    from faithproxy.faithcore.correction.wire import ChatChunkReader
    from faithproxy.faithcore.reasoning_formats import ReasoningFormat

# The upstream events of one recorded round (faithcore/correction/events.py), as detect mode's machine
# reads them: `Delta`s named by the chat field their text would have come in, `Extras`, a `RoundEnd`.
RoundEvents = list["Delta | Extras | RoundEnd"]
# (the captured bytes, whether they are a stream) -> the round's events; None when they hold no whole chain.
ShadowReader = Callable[[bytes, bool], "RoundEvents | None"]


def _same_format(fmt: ReasoningFormat) -> ReasoningFormat:
    return fmt


@dataclass(frozen=True)
class RoundWire:
    """How a door's rounds talk to vLLM: the path, how a round's body is built from the client's body,
    which wire reader (faithcore/correction/wire.py) reads its chunks, and how the reasoning format is
    adapted (a raw prompt has no chat template to close a think block)."""

    path: str
    round_body: Callable[[dict[str, Any], StartRound], dict[str, Any]]
    reader: Callable[[], ChatChunkReader]
    reasoning_format: Callable[[ReasoningFormat], ReasoningFormat] = _same_format
