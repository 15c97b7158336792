"""Faults a fake upstream injects, by name, on top of what its script says.

    ok                    the script's answer
    http_500              500 with vLLM's error body, before any byte of an answer
    stall_before_headers  no status line until the fake is released, then a 503
    die_mid_stream        a stream's first two content frames, then the connection drops
    stall_mid_stream      a stream's first two content frames, then silence until the client goes
                          (counted in `aborted`) or the fake is released
    malformed_sse         a stream's first two content frames, a frame cut inside its JSON, [DONE];
                          a non-streamed answer that is not JSON
    truncated             a stream's content frames, then a clean end: no usage, no [DONE]

The mid-stream faults touch streamed answers only, as in vLLM: a non-streamed request to a vLLM that
dies or stalls mid-way is one the tests do not need (the proxy always streams from upstream in
correct and detect modes).
"""

from __future__ import annotations

from typing import Literal

from faithproxy.testing.answer import Answer, Reset, Stall, Stream
from faithproxy.testing.wire import DONE, error_body

Fault = Literal[
    "ok", "http_500", "stall_before_headers", "die_mid_stream", "stall_mid_stream", "malformed_sse", "truncated"
]
FAULTS: tuple[Fault, ...] = Fault.__args__  # type: ignore[attr-defined]
# Content frames a mid-stream fault lets through first: a whole step or two reaches the client.
FRAMES_BEFORE_FAULT = 2
CUT_FRAME = b'data: {"choices": [{"index": 0, "delta": {"content": "cut\n\n' + DONE


def before_answer(fault: Fault) -> Answer | None:
    """The answer a fault gives instead of the script's, whatever the request; None: ask the script."""
    if fault == "http_500":
        return Answer.json(500, error_body("injected", "InternalServerError"))
    if fault == "stall_before_headers":
        return Answer.json(503, error_body("released", "x"), before=(Stall(),))
    return None


def faulty_stream(fault: Fault, stream: Stream) -> Answer:
    """A streamed answer with `fault` applied."""
    if fault == "die_mid_stream":
        return Answer.stream((*stream.first_frames(FRAMES_BEFORE_FAULT), Reset()))
    if fault == "stall_mid_stream":
        return Answer.stream((*stream.first_frames(FRAMES_BEFORE_FAULT), Stall()))
    if fault == "malformed_sse":
        return Answer.stream((*stream.first_frames(FRAMES_BEFORE_FAULT), CUT_FRAME))
    if fault == "truncated":
        return Answer.stream(stream.opening + stream.content)
    return Answer.stream(stream)


def faulty_reply(fault: Fault, reply: Answer) -> Answer:
    """A non-streamed answer with `fault` applied."""
    if fault == "malformed_sse":
        return Answer(200, "application/json", (b"{not json",))
    return reply
