"""clients/vllm.py's UpstreamStream: `batches()` hands over one list per read, the chunks `chunks()`
yields one by one, in order, up to [DONE]; a malformed chunk or a missing [DONE] raises after the
chunks that came before it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from faithproxy.clients.vllm import UpstreamStream
from faithproxy.faithcore.errors import UpstreamError, UpstreamErrorCode


class Reads:
    """An UpstreamBody whose body arrives in the given pieces, one per read."""

    status = 200
    headers = {"content-type": "text/event-stream"}

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = pieces

    async def iter_raw(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece

    async def read(self) -> bytes:
        return b"".join(self.pieces)

    async def aclose(self) -> None:
        pass


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def texts(batch: list[dict]) -> list[str]:
    return [c["choices"][0]["delta"]["content"] for c in batch]


async def collect(stream: UpstreamStream) -> tuple[list[list[str]], UpstreamError | None]:
    batches: list[list[str]] = []
    try:
        async for batch in stream.batches():
            batches.append(texts(batch))
    except UpstreamError as exc:
        return batches, exc
    return batches, None


async def test_one_batch_per_read_and_the_same_chunks_as_one_by_one() -> None:
    body = event("a") + event("b") + event("c") + event("d") + b"data: [DONE]\n\n"
    pieces = (body[:10], body[10:70], body[70:200], body[200:])
    batches, error = await collect(UpstreamStream(Reads(*pieces)))
    assert error is None and sum(batches, []) == ["a", "b", "c", "d"]
    assert all(batches) and len(batches) <= len(pieces)  # no empty batch; never more than one per read
    one_by_one = [texts([c])[0] async for c in UpstreamStream(Reads(*pieces)).chunks()]
    assert one_by_one == ["a", "b", "c", "d"]
    together, _ = await collect(UpstreamStream(Reads(body)))
    assert together == [["a", "b", "c", "d"]]


async def test_nothing_after_done_is_read() -> None:
    batches, error = await collect(UpstreamStream(Reads(event("a") + b"data: [DONE]\n\n" + event("late"))))
    assert batches == [["a"]] and error is None


async def test_the_chunks_before_a_malformed_one_come_first() -> None:
    batches, error = await collect(UpstreamStream(Reads(event("a") + b"data: {not json\n\n" + event("b"))))
    assert batches == [["a"]]
    assert error is not None and error.code == UpstreamErrorCode.MALFORMED


@pytest.mark.parametrize("tail", [b"", event("b")[:-2]])  # cut between events, or inside the last one
async def test_a_stream_without_done_ends_in_an_error_after_its_chunks(tail: bytes) -> None:
    batches, error = await collect(UpstreamStream(Reads(event("a"), tail)))
    assert sum(batches, []) == (["a"] if not tail else ["a", "b"])  # flush() completes a last event
    assert error is not None and error.code == UpstreamErrorCode.STREAM_TRUNCATED
