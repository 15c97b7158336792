"""ReflectRegenerator on a scripted vLLM (httpx.MockTransport): greedy first, then `n` samples per
sampled try, never handing back the flagged sentence or a rewrite the detector already rejected.
The same regenerator against real vLLM: tests/benchmarks/shapesworld/test_sw_model_vllm.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from faithproxy.clients.vllm import VLLMClient
from faithproxy.faithcore.context import RequestView, Usage
from faithproxy.faithcore.errors import RegenerationError
from faithproxy.faithcore.types import Step, StepKind
from faithproxy.regenerators.reflect import ReflectRegenerator, restated_share

BAD = "There are 4 objects in the image."


def completion(*texts: str) -> dict[str, Any]:
    choices = [{"index": i, "message": {"role": "assistant", "content": t}} for i, t in enumerate(texts)]
    return {"id": "c", "choices": choices, "usage": {"prompt_tokens": 10, "completion_tokens": 5 * len(texts)}}


class ScriptedVLLM:
    def __init__(self, *replies: dict[str, Any] | int) -> None:
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        reply = self.replies[len(self.bodies) - 1]
        if isinstance(reply, int):
            return httpx.Response(reply, json={"error": {"message": "boom", "type": "server_error"}})
        return httpx.Response(200, json=reply)


async def regenerate(
    upstream: ScriptedVLLM, attempt: int, rejected: list[str] | None = None, **kwargs: Any
) -> tuple[str | None, Usage]:
    """The candidate and the tokens the try reports (its Regeneration)."""
    client = VLLMClient("http://vllm.test", transport=httpx.MockTransport(upstream.handler))
    view = RequestView("r1", "m", [{"role": "user", "content": "How many objects?"}], "How many objects?")
    step = Step(index=0, text=BAD, raw=BAD, kind=StepKind.PERCEPTION, rejected=list(rejected or []))
    try:
        result = await ReflectRegenerator(client, **kwargs).regenerate(view, [], step, attempt)
    finally:
        await client.aclose()
    return result.candidate, result.usage


async def test_greedy_first_try_that_says_something_new_is_taken():
    upstream = ScriptedVLLM(completion("[There are 3 objects in the image.]"))
    result, usage = await regenerate(upstream, attempt=1)
    assert result == "There are 3 objects in the image."
    assert len(upstream.bodies) == 1
    assert upstream.bodies[0]["temperature"] == 0.0 and "n" not in upstream.bodies[0]
    assert usage.completion_tokens == 5


async def test_greedy_repeat_of_the_flagged_sentence_falls_back_to_samples():
    upstream = ScriptedVLLM(
        completion(f"[{BAD}]"),
        completion(
            f"[{BAD}]", "no brackets", "[There are 2 objects in the image.]", "[There are 3 objects in the image.]"
        ),
    )
    result, usage = await regenerate(upstream, attempt=1, samples=4)
    assert result == "There are 2 objects in the image."  # new ones tie at one vote: the earliest
    sampled = upstream.bodies[1]
    assert (sampled["n"], sampled["temperature"], sampled["seed"]) == (4, 0.8, 4)
    assert usage.completion_tokens == 5 + 20  # both calls are accounted


async def test_the_rewrite_most_samples_agree_on_is_taken():
    two, three = "[There are 2 objects in the image.]", "[There are 3 objects in the image.]"
    upstream = ScriptedVLLM(completion(two, f"[{BAD}]", three, f"[{BAD}]", three))
    result, _ = await regenerate(upstream, attempt=2, samples=5)
    assert result == "There are 3 objects in the image."  # 2 votes against 1; the repeats of BAD do not count


async def test_rejected_rewrites_are_skipped_and_tries_get_disjoint_seeds():
    rejected = ["There are 3 objects in the image."]
    upstream = ScriptedVLLM(completion(f"[{rejected[0]}]", f"[{BAD}]", "[There are 2 objects in the image.]"))
    result, _ = await regenerate(upstream, attempt=3, rejected=rejected, samples=3)
    assert result == "There are 2 objects in the image."
    assert upstream.bodies[0]["seed"] == 9  # try 3 of 3 samples: seeds 9, 10, 11 (try 2 had 6, 7, 8)


async def test_nothing_new_is_a_failed_try():
    upstream = ScriptedVLLM(completion(f"[{BAD}]", f"[{BAD}]"))
    result, _ = await regenerate(upstream, attempt=2, samples=2)
    assert result is None


async def test_greedy_only_when_temperature_is_zero():
    upstream = ScriptedVLLM(completion(f"[{BAD}]"))
    result, _ = await regenerate(upstream, attempt=2, temperature=0.0)
    assert result is None and len(upstream.bodies) == 1 and upstream.bodies[0]["temperature"] == 0.0


async def test_upstream_failure_is_a_regeneration_error():
    upstream = ScriptedVLLM(500)
    with pytest.raises(RegenerationError, match="regeneration call failed"):
        await regenerate(upstream, attempt=2)


def test_samples_must_be_positive():
    with pytest.raises(ValueError, match="samples"):
        ReflectRegenerator(VLLMClient("http://vllm.test"), samples=0)


async def test_samples_that_mostly_restate_the_flagged_sentence_say_the_model_insists():
    """With insist_share, a try whose samples mostly restate the flagged claim reports it instead of a
    candidate; below the share, or without it, the most agreed new rewrite is taken as before."""
    two = "[There are 2 objects in the image.]"
    restating = (f"[{BAD}]", f"[{BAD}]", f"[  {BAD}]", two)  # 3 of 4 restate it
    client = VLLMClient("http://vllm.test", transport=httpx.MockTransport(ScriptedVLLM(
        completion(f"[{BAD}]"), completion(*restating), completion(f"[{BAD}]"), completion(*restating),
        completion(f"[{BAD}]"), completion(*restating)).handler))  # fmt: skip
    view = RequestView("r1", "m", [{"role": "user", "content": "How many objects?"}], "How many objects?")
    step = Step(index=0, text=BAD, raw=BAD, kind=StepKind.PERCEPTION)
    try:
        insists = await ReflectRegenerator(client, samples=4, insist_share=0.75).regenerate(view, [], step, 1)
        lenient = await ReflectRegenerator(client, samples=4, insist_share=0.8).regenerate(view, [], step, 1)
        off = await ReflectRegenerator(client, samples=4).regenerate(view, [], step, 1)
    finally:
        await client.aclose()
    assert insists.insisted and insists.candidate is None and insists.usage.completion_tokens == 5 + 20
    assert not lenient.insisted and lenient.candidate == "There are 2 objects in the image."
    assert not off.insisted and off.candidate == "There are 2 objects in the image."
    assert restated_share([BAD.upper(), None, "other"], BAD) == pytest.approx(1 / 3)  # case and spacing aside
    assert restated_share([], BAD) == 0.0
    with pytest.raises(ValueError, match="insist_share"):
        ReflectRegenerator(client, insist_share=0.0)


async def test_a_rewrite_that_differs_only_in_case_or_spacing_is_not_new():
    """The flagged sentence or a rejected rewrite in another case or spacing would be checked again (a
    wasted judge call); spellings of one new rewrite vote together, the earliest spelling is taken."""
    rejected = ["There are 3 objects in the image."]
    upstream = ScriptedVLLM(
        completion(
            f"[{BAD.lower()}]",
            "[there are 3  objects in the image.]",
            "[There are 5 objects in the image.]",
            "[there are 2 objects in the image.]",
            "[There are 2 objects  in the image.]",
        )
    )
    result, _ = await regenerate(upstream, attempt=2, rejected=rejected, samples=5)
    assert result == "there are 2 objects in the image."  # 2 votes (two spellings) against 1


async def test_nothing_but_recased_repeats_is_a_failed_try():
    upstream = ScriptedVLLM(completion(f"[{BAD.upper()}]", f"[ {BAD} ]"))
    result, _ = await regenerate(upstream, attempt=2, samples=2)
    assert result is None
