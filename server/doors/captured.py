"""What the doors' shadow readers share: reading a response that off mode passed through.

Off mode passes each door's bytes through to vLLM's endpoint of the same API, so a response sampled for
a shadow check (server/shadow/checker.py) is in its door's wire, streamed or as one JSON body. Each door's
`shadow_reader` (its module) turns it into the upstream events of one round, which is what detect mode's
machine reads on that door (server/protocol/wires.py `ShadowReader`); these are the pieces they share.
The round's usage is dropped: it is the original request's spend, not the check's.

The machine's events and wire readers are imported where they are first made, not with this module:
the door table imports every door, and so this module, into every server, and a server that only passes
requests through never needs the correction machine's package.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from faithproxy.clients.sse import SSEBytesDecoder

if TYPE_CHECKING:
    from faithproxy.faithcore.correction.wire import ChatChunkReader
    from faithproxy.server.protocol.wires import RoundEvents


def sse_objects(data: bytes) -> list[dict[str, Any]] | None:
    """The JSON objects of an event stream up to `[DONE]`; None when one is not JSON."""
    decoder = SSEBytesDecoder()
    out = []
    for payload in [*decoder.feed(data), *decoder.flush()]:
        if payload.strip() == b"[DONE]":
            break
        try:
            obj = json.loads(payload)
        except ValueError:
            return None
        if isinstance(obj, dict):
            out.append(obj)
    return out


def json_body(data: bytes) -> dict[str, Any] | None:
    """A whole response's JSON object; None when it is not one."""
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def chat_reader() -> ChatChunkReader:
    """A reader of chat-completions chunks (`choices[0].delta`)."""
    from faithproxy.faithcore.correction.wire import ChatChunkReader

    return ChatChunkReader()


def completion_reader() -> ChatChunkReader:
    """A reader of completions chunks (`choices[0].text`): the completions door's rounds and captures."""
    from faithproxy.faithcore.correction.wire import CompletionChunkReader

    return CompletionChunkReader()


def chunk_events(chunks: list[dict[str, Any]] | None, reader: ChatChunkReader) -> RoundEvents | None:
    """OpenAI-style chunks read by a round's wire reader, as one round's events (their usage left out)."""
    from faithproxy.faithcore.correction import RoundEnd

    if chunks is None:
        return None
    events: RoundEvents = []
    for chunk in chunks:
        events += reader.events({k: v for k, v in chunk.items() if k != "usage"})
    end = reader.end()
    return [*events, RoundEnd(end.finish_reason, None, end.upstream_id)]


def text_events(texts: list[tuple[str, str]], finish_reason: str | None, upstream_id: str | None) -> RoundEvents:
    """One round's events from its texts in order, each (the chat field it would have come in, text)."""
    from faithproxy.faithcore.correction import Delta, RoundEnd

    return [*(Delta(field, text) for field, text in texts), RoundEnd(finish_reason, None, upstream_id)]
