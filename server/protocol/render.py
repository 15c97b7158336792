"""What a door writes: a `Renderer` turns the correction machine's emits into one response in its API.

The serving object (server/doors/serving.py `DoorServing`, one for every door) runs the chain session,
keeps the accounting and serves off mode; the door's renderer (`Door.renderer`, one per API) only writes:
each emit as the frames of a stream (`text`, `verdicts`, `extra`, `end`, `usage`, `error`, then `done`),
or everything at once as the non-streamed body (`body`: a model of the door's response, which the
serving object serializes); frames and bodies are built from the door's response models. One renderer
serves one response, so a renderer that must remember what it opened (a Responses output item, a
Messages content block) keeps it itself.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from faithproxy.server.protocol.sse import DONE

if TYPE_CHECKING:  # annotations only: a server that only passes requests through never loads the machine
    from faithproxy.faithcore.correction import EmitExtra, EmitText
    from faithproxy.faithcore.errors import FaithproxyError


@dataclass(frozen=True, slots=True)
class Reply:
    """What a renderer knows of its request: its id, the model, when it arrived, the client's body (in the
    door's API: not the chat body a translated door drives vLLM with)."""

    request_id: str
    model: str
    started_wall: float  # time.time() when the request arrived: a non-streamed body's `created`
    request: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ending:
    """What the request spent and found, written where a door's API puts its last word."""

    usage: dict[str, Any]  # the generator's tokens, OpenAI's names (prompt_tokens, completion_tokens, ...)
    judge_usage: dict[str, Any]  # the judge's bill, one field to set beside `usage` (server/chain/judge_bill.py)
    summary: dict[str, Any]  # the `faithfulness` summary (server/observe/summary.py)


@dataclass(frozen=True, slots=True)
class Answer:
    """What a whole (non-streamed) response says: its text by chat field (`content`, `reasoning`,
    `reasoning_content`), the extra message fields (tool calls...) and why it ended."""

    text: dict[str, str]
    extras: dict[str, Any]
    finish_reason: str | None


class Renderer(abc.ABC):
    """One response of a door's API. `text`, `verdicts`, `extra` and `end` give the frames of one emit
    (`step`: the annotation of the step a text completes, when the client asked for annotations); `usage`
    the frames a client asking for `stream_options.include_usage` gets after the end; `error` the frame
    that ends a stream failed after its first byte; `done` what follows the last frame; `body` the whole
    response of a request that did not ask for a stream."""

    done: bytes = DONE  # `data: [DONE]` on OpenAI's chat and completions APIs; b"" where the last event says so
    media_type = "text/event-stream"  # the stream's content type

    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    @abc.abstractmethod
    def text(self, item: EmitText, step: dict[str, Any] | None) -> list[bytes]: ...

    @abc.abstractmethod
    def verdicts(self, verdicts: list[dict[str, Any]]) -> list[bytes]: ...

    def extra(self, item: EmitExtra) -> list[bytes]:
        """Message fields beside the text (tool calls...): only chat carries them; other doors refuse
        what would bring them before the chain starts."""
        return []

    @abc.abstractmethod
    def end(self, finish_reason: str | None, ending: Ending) -> list[bytes]: ...

    def usage(self, ending: Ending) -> list[bytes]:
        """The frames after the end for a client that set `stream_options.include_usage`; none by default."""
        return []

    @abc.abstractmethod
    def error(self, exc: FaithproxyError) -> bytes: ...

    @abc.abstractmethod
    def body(self, answer: Answer, ending: Ending) -> BaseModel: ...
