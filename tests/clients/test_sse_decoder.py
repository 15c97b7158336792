"""The upstream SSE decoder gives the same events for any split of the byte stream."""

from hypothesis import given, settings
from hypothesis import strategies as st

from faithproxy.clients.sse import SSEDecoder

STREAM = (
    'data: {"a": 1}\n\n'
    ": keep-alive comment\n\n"
    'data: {"b": "line one"}\r\n\r\n'
    "event: message\ndata: part1\ndata: part2\n\n"
    "data: [DONE]\n\n"
)
EXPECTED = ['{"a": 1}', '{"b": "line one"}', "part1\npart2", "[DONE]"]


def decode(pieces: list[str]) -> list[str]:
    decoder = SSEDecoder()
    events: list[str] = []
    for piece in pieces:
        events.extend(decoder.feed(piece))
    events.extend(decoder.flush())
    return events


def test_whole_stream() -> None:
    assert decode([STREAM]) == EXPECTED


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    pieces = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert decode(pieces) == EXPECTED


def test_unterminated_last_event_is_flushed() -> None:
    assert decode(['data: {"x": 1}']) == ['{"x": 1}']
