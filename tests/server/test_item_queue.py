"""server/reader.py's ItemQueue: items come out in the order they went in; quiet ones (correct mode's
text deltas) never wake the consumer by themselves, and are taken with the next item that does."""

from __future__ import annotations

import asyncio

import pytest

from faithproxy.faithcore.types import Channel, Step, StepKind
from faithproxy.server.reader import ItemQueue, RoundEnd, TextDelta


def _delta(text: str) -> TextDelta:
    return TextDelta(Channel.CONTENT, "content", text)


async def test_quiet_items_wait_for_one_that_wakes_then_come_first() -> None:
    queue = ItemQueue(quiet=(TextDelta,))
    getter = asyncio.ensure_future(queue.get())
    queue.put_nowait(_delta("The"))
    queue.put_nowait(_delta(" car."))
    await asyncio.sleep(0.01)
    assert not getter.done()  # two deltas: nothing for the session to do yet
    step = Step(index=0, text="The car.", raw="The car.", channel=Channel.CONTENT, kind=StepKind.PERCEPTION)
    queue.put_nowait(step)
    assert (await asyncio.wait_for(getter, 5)).text == "The"  # the first item, quiet or not
    rest = []
    while not queue.empty():
        rest.append(queue.get_nowait())
    assert [type(i) for i in rest] == [TextDelta, Step] and rest[0].text == " car."
    with pytest.raises(asyncio.QueueEmpty):
        queue.get_nowait()


async def test_a_queued_waking_item_is_not_waited_for_again() -> None:
    queue = ItemQueue(quiet=(TextDelta,))
    queue.put_nowait(_delta("a"))
    queue.put_nowait(RoundEnd("stop", None))
    assert isinstance(await asyncio.wait_for(queue.get(), 5), TextDelta)
    assert isinstance(await asyncio.wait_for(queue.get(), 5), RoundEnd)  # still queued: returned at once
    queue.put_nowait(_delta("b"))  # quiet, and the waking one was taken: get waits again
    getter = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0.01)
    assert not getter.done() and queue.qsize() == 1
    getter.cancel()


async def test_without_quiet_types_every_item_wakes_like_an_asyncio_queue() -> None:
    queue = ItemQueue()
    getter = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    queue.put_nowait(_delta("x"))
    assert (await asyncio.wait_for(getter, 5)).text == "x"
