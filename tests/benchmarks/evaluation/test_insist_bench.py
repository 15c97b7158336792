"""`faithproxy bench insist`: the flags of a run's traces with their ground truth, the rewrites of the
first sampled try read through ReflectRegenerator on a scripted vLLM, and the table of stops per share.
The measurement itself runs against real vLLM (the command in docs/judge.md)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.evaluation.insist_bench import (
    ATTEMPT,
    Flag,
    flags_of,
    measure,
    right_share_at,
    steps_of_labelled,
    stop_rates,
    stop_table,
)
from faithproxy.benchmarks.shapesworld.export import image_sha256
from faithproxy.benchmarks.shapesworld.language import ObjectClaim, render_claim
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items
from faithproxy.benchmarks.shapesworld.world import Ref
from faithproxy.clients.vllm import VLLMClient


def sentences(item: Any) -> tuple[str, str]:
    obj = item.scene.objects[0]
    wrong = "green" if obj.colour != "green" else "red"
    return render_claim(ObjectClaim(Ref.of(obj))), render_claim(
        ObjectClaim(Ref(obj.shape, wrong, obj.size, obj.row, obj.col))
    )


def step(text: str, detected: str, original: str | None = None, attempts: int = 0) -> dict[str, Any]:
    return {"text": text, "original_text": original, "detected": detected, "attempts": attempts}


@pytest.fixture(scope="module")
def items() -> list[Any]:
    return heldout_items(2, 997, start=1600)


def test_flags_carry_their_truth_prefix_and_what_the_run_did(items: list[Any]) -> None:
    true, false = sentences(items[0])
    trace = {"id": "r1", "images": [image_sha256(items[0].scene)], "steps": [
        step(true, "unfaithful", attempts=3),  # a false flag, kept
        step(true, "unfaithful", original=false, attempts=1),  # a true flag, fixed
        step("So the answer is A.", "faithful"),
    ]}  # fmt: skip
    flags = flags_of([trace], items)
    assert [(f.true, f.fixed, f.rewritten, f.attempts) for f in flags] == [
        (True, False, False, 3),
        (False, True, True, 1),
    ]
    assert flags[1].prefix == (true,) and flags[1].draft == false
    with pytest.raises(ValueError, match="not one of the items"):
        flags_of([{"id": "r2", "images": ["0" * 64], "steps": []}], items)


def test_stops_per_share_and_whether_they_are_right() -> None:
    def flag(true: bool, restated: float, fixed: bool = False) -> Flag:
        return Flag("i", "s", (), true, fixed, fixed, 3, restated)

    table = stop_table(
        [flag(True, 1.0), flag(True, 0.75), flag(False, 0.75, fixed=True), flag(False, 0.0)], (0.75, 1.0)
    )
    assert [(r["stops"], r["right"], r["wrong"], r["right_share"]) for r in table] == [
        (3, 2, 1, 0.6667),
        (1, 1, 0, 1.0),
    ]
    assert table[0]["fixes_lost"] == 1 and table[0]["false_flags"] == 2 and table[0]["true_flags_stopped"] == 1
    assert stop_table([], (0.5,))[0]["right_share"] is None


async def test_the_sampled_try_is_asked_as_the_proxy_asks_it(items: list[Any]) -> None:
    true, false = sentences(items[1])
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        texts = [f"[{false.upper()}]", f"[{false}]", f"[{true}]", "no bracket"]
        choices = [{"index": i, "message": {"role": "assistant", "content": t}} for i, t in enumerate(texts)]
        return httpx.Response(200, json={"choices": choices, "usage": {"prompt_tokens": 1, "completion_tokens": 4}})

    client = VLLMClient("http://vllm.test", transport=httpx.MockTransport(handler))
    try:
        measured = await measure([Flag(items[1].id, false, (), False, False, False, 3)], items, client, 4, 2)
    finally:
        await client.aclose()
    assert measured[0].restated == 0.5  # two of four samples restate it, case aside
    assert (bodies[0]["n"], bodies[0]["seed"], bodies[0]["temperature"]) == (4, ATTEMPT * 4, 0.8)
    assert bodies[0]["messages"][0]["content"][0]["type"] == "image_url"


def test_labelled_chains_give_every_perception_step_and_the_stop_rates_by_truth(items: list[Any]) -> None:
    true, false = sentences(items[0])
    record = {"id": "c", "image": image_sha256(items[0].scene), "steps": [
        {"text": true, "kind": "perception", "faithful": True},
        {"text": "So it is A.", "kind": "reasoning", "faithful": None},
        {"text": false, "kind": "perception", "faithful": False},
    ]}  # fmt: skip
    steps = steps_of_labelled([record], items)
    assert [(f.draft, f.true, f.prefix) for f in steps] == [(true, True, ()), (false, False, (true, "So it is A."))]
    with pytest.raises(ValueError, match="not one of the items"):
        steps_of_labelled([record | {"image": "x"}], items)
    flags = [Flag("i", "s", (), True, False, False, 0, r) for r in (1.0, 0.5, 0.0, 0.0)]
    flags += [Flag("i", "s", (), False, False, False, 0, r) for r in (1.0, 0.0)]
    rate = stop_rates(flags, (0.5,))[0]
    assert (rate["stop_rate_true"], rate["stop_rate_false"]) == (0.5, 0.5)
    assert right_share_at(rate, 0.2) == 0.8  # stopping is as likely either way: the flags' own mix
    assert right_share_at({"stop_rate_true": 0.0, "stop_rate_false": 0.0}, 0.2) is None
