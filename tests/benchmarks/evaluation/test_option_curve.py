"""Option log-probabilities after each step, read from an OpenAI-compatible server's top_logprobs."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from faithproxy.benchmarks.evaluation.labelled import LabelledChain, LabelledStep
from faithproxy.benchmarks.evaluation.option_curve import (
    CurveSettings,
    chain_curve,
    collect,
    letter_logprobs,
    partial_answer,
)
from faithproxy.benchmarks.evaluation.report import freak_curve
from faithproxy.clients.vllm import VLLMClient

CHAIN = LabelledChain("c", "What colour is the car? A. red B. blue",
                      [LabelledStep("The car is red."), LabelledStep("Wait, the car is blue.")],
                      gold_answer="A", extra={"distractor": "B"})  # fmt: skip


def logprobs_for(partial: str) -> dict[str, Any]:
    """Once the chain says "blue", B is likely; before, A is. Tokens come dressed as vLLM sends them."""
    if "blue" in partial:
        top = [("B", 0.8), (" A", 0.2)]
    else:
        top = [("A", 0.6), (" B", 0.3), ("The", 0.1)]
    entries = [{"token": t, "logprob": math.log(p), "bytes": None} for t, p in top]
    return {"content": [{**entries[0], "top_logprobs": entries}]}


def fake_vllm_app() -> FastAPI:
    app = FastAPI()
    app.state.bodies = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        app.state.bodies.append(body)
        partial = body["messages"][-1]["content"]
        message = {"role": "assistant", "content": "A"}
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": message, "logprobs": logprobs_for(partial),
                             "finish_reason": "length"}]}  # fmt: skip

    return app


def test_partial_answer_and_letter_parsing() -> None:
    settings = CurveSettings(model="m", think_open="<think>\n")
    assert partial_answer(["One.", "Two."], 1, settings) == "<think>\nOne.\nSo the answer is ("
    assert partial_answer(["One."], 0, settings) == "<think>\n\nSo the answer is ("
    completion = {"choices": [{"logprobs": logprobs_for("")}]}
    assert letter_logprobs(completion, "ABCD") == {"A": math.log(0.6), "B": math.log(0.3)}
    assert letter_logprobs(completion, "A") == {"A": math.log(0.6)}
    assert letter_logprobs({"choices": [{"logprobs": None}]}, "ABCD") == {}


async def test_one_request_per_prefix_and_the_curve() -> None:
    app = fake_vllm_app()
    transport = httpx.ASGITransport(app=app)
    client = VLLMClient("http://vllm.test", transport=transport)
    try:
        record, failed = await chain_curve(client, CHAIN, CurveSettings(model="m"))
    finally:
        await client.aclose()
    assert failed == 0 and len(app.state.bodies) == 3
    body = app.state.bodies[1]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 1 and body["logprobs"] is True and body["top_logprobs"] == 20
    assert body["messages"][-1]["content"] == "The car is red.\nSo the answer is ("
    assert record["gold_answer"] == "A" and record["distractor"] == "B"
    curve = freak_curve([record])
    # renormalised over the letters found: 0.6 / 0.9 before "blue", 0.2 / 1.0 after it
    assert [p for _, p, _, _ in curve.by_step] == pytest.approx([2 / 3, 2 / 3, 0.2])
    assert [d for _, _, d, _ in curve.by_step] == pytest.approx([1 / 3, 1 / 3, 0.8])


async def test_failures_leave_empty_entries_and_chains_without_gold_are_skipped() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"message": "down"}})

    client = VLLMClient("http://vllm.test", transport=httpx.MockTransport(broken))
    no_gold = LabelledChain("n", "q", [LabelledStep("x")])
    try:
        records, failed = await collect(client, [CHAIN, no_gold], CurveSettings(model="m"), progress=False)
    finally:
        await client.aclose()
    assert [r["id"] for r in records] == ["c"] and failed == 3
    assert records[0]["option_logprobs"] == [{}, {}, {}]
