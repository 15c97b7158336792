"""The evaluation judge: its prompt, its reply parser, and whole chains labelled over both judge protocols."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI, Request

from faithproxy.benchmarks.evaluation.judge_upr import (
    build_evaluation_prompt,
    judge_upr,
    parse_evaluation_prompt,
    parse_evaluation_reply,
)
from faithproxy.benchmarks.evaluation.labelled import LabelledChain, LabelledStep
from faithproxy.clients.judges import JudgeConfig, build_judge
from faithproxy.faithcore.errors import DetectorError
from faithproxy.testing import running_app

UNFAITHFUL = {"The car is blue.", "There are three dogs."}
REASONING = {"So the answer is B.", "So the answer is A."}


def oracle_reply(sentences: list[str]) -> str:
    """A perfect evaluation judge, in the Table-14 block layout."""
    lines = ["Image description: a red car next to two dogs."]
    for k, sentence in enumerate(sentences, start=1):
        lines.append(f'Sentence {k}: "{sentence}"')
        if sentence in REASONING:
            lines.append("Type: REASONING")
        else:
            lines += ["Type: PERCEPTION", f"Faithfulness: {'UNFAITHFUL' if sentence in UNFAITHFUL else 'FAITHFUL'}"]
    return "\n".join(lines)


def evaluation_judge_app() -> FastAPI:
    app = FastAPI()
    app.state.seen = []

    def answer(text: str) -> str:
        question, sentences = parse_evaluation_prompt(text)
        app.state.seen.append((question, sentences))
        return oracle_reply(sentences)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        text = next(p["text"] for p in body["messages"][-1]["content"] if p["type"] == "text")
        message = {"role": "assistant", "content": answer(text)}
        usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "j", "usage": usage,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip

    @app.post("/v1/messages")
    async def messages(request: Request) -> dict[str, Any]:
        body = await request.json()
        text = next(b["text"] for b in body["messages"][-1]["content"] if b["type"] == "text")
        return {"id": "m", "type": "message", "role": "assistant", "model": "j", "stop_reason": "end_turn",
                "content": [{"type": "text", "text": answer(text)}], "stop_sequence": None,
                "usage": {"input_tokens": 90, "output_tokens": 30}}  # fmt: skip

    return app


CHAINS = [
    LabelledChain("a", "What colour is the car?", [LabelledStep(t) for t in
                  ["The image shows a car.", "The car is blue.", "So the answer is B."]]),
    LabelledChain("b", "How many dogs?", [LabelledStep(t) for t in ["There are three dogs.", "So the answer is A."]],
                  extra={"correct": False}),
    LabelledChain("c", "Empty?", []),
]  # fmt: skip


def test_prompt_round_trip_and_structure() -> None:
    prompt = build_evaluation_prompt("What colour?\n", ["The car\n is red.", "So it is A."])
    assert parse_evaluation_prompt(prompt) == ("What colour?", ["The car is red.", "So it is A."])
    assert "Faithfulness: FAITHFUL or UNFAITHFUL" in prompt and "Image description:" in prompt
    with pytest.raises(ValueError, match="not an evaluation prompt"):
        parse_evaluation_prompt("hello")


def test_reply_parser_canonical_and_lenient() -> None:
    sentences = ["The image shows a car.", "The car is blue.", "So the answer is B."]
    reply = parse_evaluation_reply(oracle_reply(sentences), 3)
    assert [(x.kind, x.faithful) for x in reply.labels] == [
        ("perception", True), ("perception", False), ("reasoning", None)]  # fmt: skip
    assert reply.description == "a red car next to two dogs." and reply.missing == 0
    messy = "\n".join([
        "Here is the car picture.",
        "**Sentence 1**: \"The car is UNFAITHFUL-looking.\" — Type: perception, Faithfulness: faithful",
        "- Sentence 2 (PERCEPTION) UNFAITHFUL",
        "### Sentence 3: 'So the answer is B.'",
        "Type: REASONING",
        "Faithfulness: N/A",
    ])  # fmt: skip
    reply = parse_evaluation_reply(messy, 4)
    assert [(x.kind, x.faithful) for x in reply.labels] == [
        ("perception", True), ("perception", False), ("reasoning", None), (None, None)]  # fmt: skip
    assert reply.missing == 1 and reply.description == "Here is the car picture."
    undecided = parse_evaluation_reply('Sentence 1: "x"\nType: PERCEPTION', 1)
    assert undecided.labels[0].faithful is None and undecided.unlabelled_perception == 1
    with pytest.raises(DetectorError, match="no sentence block") as info:
        parse_evaluation_reply("I cannot see the image.", 2)
    assert info.value.code == "unparseable"


@pytest.fixture
async def judge_url() -> AsyncIterator[tuple[str, FastAPI]]:
    app = evaluation_judge_app()
    async with running_app(app) as url:
        yield url, app


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
async def test_whole_chains_labelled_through_a_real_sdk(judge_url: tuple[str, FastAPI], backend: str) -> None:
    url, app = judge_url
    config = JudgeConfig(name="eval", backend=backend, model="j", api_key="k", max_retries=0,
                         base_url=f"{url}/v1" if backend == "openai" else url)  # fmt: skip
    judge = build_judge(config)
    try:
        labelled, report = await judge_upr(CHAINS, judge, progress=False)
    finally:
        await judge.aclose()
    assert [c.id for c in labelled] == ["a", "b", "c"]
    assert [(s.kind, s.faithful) for s in labelled[0].steps] == [
        ("perception", True), ("perception", False), ("reasoning", None)]  # fmt: skip
    assert [(s.kind, s.faithful) for s in labelled[1].steps] == [("perception", False), ("reasoning", None)]
    assert report.judge_calls == 2 and len(app.state.seen) == 2  # the empty chain costs nothing
    assert sorted(app.state.seen)[0] == ("How many dogs?", ["There are three dogs.", "So the answer is A."])
    assert report.upr["upr"] == pytest.approx(2 / 3)
    assert (report.upr["perception_steps"], report.upr["unfaithful_steps"], report.upr["chains"]) == (3, 2, 3)
    assert report.errors == 0 and report.input_tokens == (200 if backend == "openai" else 180)
    assert labelled[0].extra["judge_upr"]["description"] == "a red car next to two dogs."
    assert labelled[1].extra["correct"] is False  # a run's grading survives the relabelling


async def test_a_failing_judge_is_counted_not_fatal() -> None:
    config = JudgeConfig(name="down", backend="openai", model="j", api_key="k", max_retries=0, timeout_s=2,
                         base_url="http://127.0.0.1:9/v1")  # fmt: skip
    judge = build_judge(config)
    try:
        labelled, report = await judge_upr(CHAINS[:2], judge, progress=False)
    finally:
        await judge.aclose()
    assert report.errors == 2 and report.upr["perception_steps"] == 0 and report.upr["upr"] is None
    assert "connection" in report.error_messages[0]
    assert all(s.kind is None and s.faithful is None for c in labelled for s in c.steps)
