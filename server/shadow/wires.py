"""What a shadow check reads from a captured off response, door by door.

Off mode passes each door's bytes through to the vLLM endpoint of the same API (server/doors/table.py), so a
sampled response is in its door's wire: chat-completions chunks, completions chunks (`choices[0].text`),
Responses events (`response.reasoning_text.delta`, `response.output_text.delta`) or Messages events
(`content_block_delta` with a `thinking_delta` or a `text_delta`), streamed or as one JSON body. A
`ShadowWire` turns them into the upstream events of one round (faithcore/correction/events.py: `Delta`s
named by the chat field their text would have come in, `Extras`, a `RoundEnd`), which is what detect mode's
machine reads on that door; and it gives the request as detect mode would have run it: the chat body (the
Responses and Messages doors' `translate`), the messages detectors read (the completions door: its prompt as
one user message) and the door's round wire (its reasoning format). A request detect mode would refuse on
its door (n > 1, a prompt that is not one string, echo, tools, ...) gives None: it is counted `unreadable`.

The round's usage is dropped: it is the original request's spend, not the check's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from faithproxy.clients.sse import SSEBytesDecoder
from faithproxy.clients.vllm import CHAT_PATH, COMPLETIONS_PATH
from faithproxy.faithcore.correction import Delta, Extras, RoundEnd
from faithproxy.faithcore.correction.wire import ChatChunkReader, CompletionChunkReader
from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.doors.table import MESSAGES_PATH, RESPONSES_PATH
from faithproxy.server.protocol.doors import Door

Events = list[Delta | Extras | RoundEnd]
# Fields a completions request may set that make its text more than one chain (detect mode refuses them).
_COMPLETIONS_NOT_A_CHAIN = ("echo", "logprobs", "suffix", "best_of", "prompt_logprobs")
# A word and the whitespace before it: how a replay cuts text (any cut gives the segmenter the same steps).
_PIECE = re.compile(r"\s*\S+|\s+")


@dataclass(frozen=True)
class ShadowRequest:
    """The request as detect mode would have run it on its door."""

    body: dict[str, Any]  # the chat body (for completions: the client's body)
    messages: list[dict[str, Any]]  # what detectors and judges read


@dataclass(frozen=True)
class ShadowWire:
    """How the shadow reads one door: `request(door, body)` and `events(data, stream)` (None: nothing to
    check). `completions`: the round is the completions door's (its wire's reasoning format)."""

    request: Callable[[Door, dict[str, Any]], ShadowRequest | None]
    events: Callable[[bytes, bool], Events | None]
    completions: bool = False


def pieces(events: Events) -> Iterator[Delta | Extras | RoundEnd]:
    """The events with every text delta cut into words (each with the whitespace before it), as a model's
    tokens would have come: a replay fed one piece at a time completes at most about one step per piece."""
    for event in events:
        if isinstance(event, Delta):
            for match in _PIECE.finditer(event.text):
                yield Delta(event.field, match.group())
        else:
            yield event


def _sse(data: bytes) -> list[dict[str, Any]] | None:
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


def _json(data: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _chunk_events(chunks: list[dict[str, Any]] | None, reader: ChatChunkReader) -> Events | None:
    if chunks is None:
        return None
    events: Events = []
    for chunk in chunks:
        events += reader.events({k: v for k, v in chunk.items() if k != "usage"})
    end = reader.end()
    return [*events, RoundEnd(end.finish_reason, None, end.upstream_id)]


# ---- chat completions ---------------------------------------------------------------------------


def _chat_request(door: Door, body: dict[str, Any]) -> ShadowRequest | None:
    if (body.get("n") or 1) != 1:
        return None
    return ShadowRequest(body, body["messages"])


def _chat_events(data: bytes, stream: bool) -> Events | None:
    if stream:
        return _chunk_events(_sse(data), ChatChunkReader())
    body = _json(data) or {}
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return None
    delta = {k: v for k, v in message.items() if k != "role"}
    chunk = {"id": body.get("id"), "choices": [{"delta": delta, "finish_reason": choice.get("finish_reason")}]}
    return _chunk_events([chunk], ChatChunkReader())


# ---- completions ----------------------------------------------------------------------------------


def _completions_request(door: Door, body: dict[str, Any]) -> ShadowRequest | None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or (body.get("n") or 1) != 1:
        return None
    for name in _COMPLETIONS_NOT_A_CHAIN:
        value = body.get(name)
        if value is not None and value is not False and not (name == "best_of" and value == 1):
            return None
    return ShadowRequest(body, [{"role": "user", "content": prompt}])


def _completions_events(data: bytes, stream: bool) -> Events | None:
    chunks = _sse(data) if stream else ([body] if (body := _json(data)) is not None else None)
    return _chunk_events(chunks, CompletionChunkReader())


# ---- Responses and Messages: read as chat (their doors' `translate`) -------------------------------


def _translated_request(door: Door, body: dict[str, Any]) -> ShadowRequest | None:
    if door.translate is None:
        return None
    try:
        chat = door.translate(body, "detect")
    except PolicyError:  # what a verified chain cannot carry (tools, previous_response_id, ...)
        return None
    return ShadowRequest(chat, chat["messages"])


def _responses_events(data: bytes, stream: bool) -> Events | None:
    events: Events = []
    if stream:
        objs = _sse(data)
        if objs is None:
            return None
        final = None
        for obj in objs:
            kind = obj.get("type")
            if kind == "response.reasoning_text.delta" and isinstance(obj.get("delta"), str):
                events.append(Delta("reasoning", obj["delta"]))
            elif kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):
                events.append(Delta("content", obj["delta"]))
            elif kind in ("response.completed", "response.incomplete"):
                final = obj.get("response")
            elif kind in ("response.failed", "error"):
                return None  # the response broke off: what came before it is no whole chain
        response = final if isinstance(final, dict) else {}
    else:
        response = _json(data) or {}
        for item in response.get("output") or ():
            field = {"reasoning": "reasoning", "message": "content"}.get(item.get("type"))
            if field is None:
                continue
            for part in item.get("content") or ():
                if part.get("type") in ("reasoning_text", "output_text") and isinstance(part.get("text"), str):
                    events.append(Delta(field, part["text"]))
    if not events:
        return None
    incomplete = response.get("status") == "incomplete"
    return [*events, RoundEnd("length" if incomplete else "stop", None, response.get("id"))]


_STOP_REASONS = {"max_tokens": "length", "end_turn": "stop", "stop_sequence": "stop"}


def _messages_events(data: bytes, stream: bool) -> Events | None:
    events: Events = []
    stop = message_id = None
    if stream:
        objs = _sse(data)
        if objs is None:
            return None
        for obj in objs:
            kind, delta = obj.get("type"), obj.get("delta") or {}
            if kind == "error":
                return None  # the stream broke off: what came before it is no whole chain
            if kind == "message_start":
                message_id = (obj.get("message") or {}).get("id")
            elif kind == "content_block_delta" and delta.get("type") == "thinking_delta":
                events.append(Delta("reasoning", delta.get("thinking") or ""))
            elif kind == "content_block_delta" and delta.get("type") == "text_delta":
                events.append(Delta("content", delta.get("text") or ""))
            elif kind == "message_delta":
                stop = delta.get("stop_reason") or stop
    else:
        message = _json(data) or {}
        message_id, stop = message.get("id"), message.get("stop_reason")
        for block in message.get("content") or ():
            if block.get("type") == "thinking":
                events.append(Delta("reasoning", block.get("thinking") or ""))
            elif block.get("type") == "text":
                events.append(Delta("content", block.get("text") or ""))
    events = [e for e in events if not isinstance(e, Delta) or e.text]
    if not events:
        return None
    return [*events, RoundEnd(_STOP_REASONS.get(stop or "", stop), None, message_id)]


# By the vLLM endpoint a door's off mode forwards to (Door.off_path): that endpoint's wire is what was captured.
WIRES: dict[str, ShadowWire] = {
    CHAT_PATH: ShadowWire(_chat_request, _chat_events),
    COMPLETIONS_PATH: ShadowWire(_completions_request, _completions_events, completions=True),
    RESPONSES_PATH: ShadowWire(_translated_request, _responses_events),
    MESSAGES_PATH: ShadowWire(_translated_request, _messages_events),
}
