"""The upstream SSE decoder gives the same events for any split of the byte stream."""

from hypothesis import given, settings
from hypothesis import strategies as st

from faithproxy.clients.sse import SSEBytesDecoder, SSEDecoder

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


# ---- the bytes decoder of the hot path: the same events ------------------------------------------


def decode_bytes(pieces: list[bytes]) -> list[str]:
    decoder = SSEBytesDecoder()
    events: list[bytes] = []
    for piece in pieces:
        events.extend(decoder.feed(piece))
    events.extend(decoder.flush())
    return [event.decode() for event in events]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM.encode())), max_size=12))
def test_the_bytes_decoder_gives_the_same_events_for_any_split(cuts: list[int]) -> None:
    wire = STREAM.encode()
    points = sorted(set(cuts))
    pieces = [wire[a:b] for a, b in zip([0, *points], [*points, len(wire)], strict=True)]
    assert decode_bytes(pieces) == EXPECTED


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("data: x{}\r\n:é")), max_size=60), st.integers(0, 60))
def test_the_bytes_decoder_agrees_with_the_text_decoder(text: str, cut: int) -> None:
    wire = text.encode()
    cut = min(cut, len(wire))
    while cut < len(wire) and (wire[cut] & 0xC0) == 0x80:  # split between characters, as text can be
        cut += 1
    assert decode_bytes([wire[:cut], wire[cut:]]) == decode(
        [text[: len(wire[:cut].decode())], text[len(wire[:cut].decode()) :]]
    )


def test_the_bytes_decoder_flushes_an_unterminated_last_event() -> None:
    assert decode_bytes([b'data: {"x": 1}']) == ['{"x": 1}']
