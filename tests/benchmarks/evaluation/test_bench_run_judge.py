"""`bench run` with a judge step (FREAK free form), failed requests, headers and resume, against a small
OpenAI-compatible server on 127.0.0.1 that plays both the target VLM and the judge (real openai SDK)."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from faithproxy.benchmarks.evaluation import run as bench_run
from faithproxy.testing import running_app
from tests.benchmarks.evaluation.releases import png, write_parquet

# FREAK's release schema (hub Parquet, build/upload.py): one multiple-choice record, three free-form ones
RECORDS = [
    {"id": 7, "type": "mcq", "question": "How many legs does the chicken have?", "item": "chicken",
     "options": ["Three.", "Two.", "Four.", "The correct answer is not listed."], "category": ["counting"],
     "ground_truth": "", "hallu_answer": None},
    {"id": 1, "type": "fib", "question": "How many legs does the chicken have?", "item": "chicken", "options": None,
     "category": ["counting"], "ground_truth": "three", "hallu_answer": "two"},
    {"id": 2, "type": "fib", "question": "What colour is the banana?", "item": "banana", "options": None,
     "category": ["color"], "ground_truth": "blue", "hallu_answer": "yellow"},
    {"id": 3, "type": "fib", "question": "How many wheels does the car have?", "item": "car", "options": None,
     "category": ["counting"], "ground_truth": "five", "hallu_answer": "four"},
]  # fmt: skip


class Fake:
    """What the fake server saw, and whether the car question fails."""

    def __init__(self) -> None:
        self.target_requests: list[dict[str, Any]] = []
        self.judge_requests: list[str] = []
        self.fail_cars = True


def create_fake(state: Fake) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "vlm", "object": "model", "created": 0, "owned_by": "me"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        message: dict[str, Any] = {"role": "assistant"}
        if body["model"] == "grader":
            prompt = body["messages"][-1]["content"][-1]["text"]
            state.judge_requests.append(prompt)
            message["content"] = "<judge>typical</judge>" if "legs" in prompt else "<judge>correct</judge>"
        else:
            parts = body["messages"][0]["content"]
            text = parts[-1]["text"]
            state.target_requests.append({"text": text, "headers": dict(request.headers), "parts": parts})
            if request.headers.get("x-fail") or ("wheels" in text and state.fail_cars):
                return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
            message["content"] = "It has two legs." if "legs" in text else "Blue."
            message["reasoning_content"] = "Looking at the image."
        return JSONResponse({
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        })  # fmt: skip

    return app


@pytest.fixture
async def fake() -> AsyncIterator[tuple[Fake, str]]:
    state = Fake()
    async with running_app(create_fake(state)) as url:
        yield state, url


def write_freak(root: Path) -> Path:
    rows = [{**r, "image": {"bytes": png(f"freak-{r['id']}"), "path": None}} for r in RECORDS]
    write_parquet(root / "data" / "test-00000-of-00001.parquet", rows)
    return root


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_run.add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_free_form_judged_failed_request_retried_on_resume(fake: tuple[Fake, str], tmp_path: Path) -> None:
    state, url = fake
    out = tmp_path / "out"
    args = parse(
        "--dataset", "freak", "--data-dir", str(write_freak(tmp_path / "data")), "--target", url,
        "--loader-arg", "mode=open", "--header", "X-Faithproxy-Detector=prompt", "--out", str(out),
        "--judge-url", url, "--judge-model", "grader", "--concurrency", "1", "--max-retries", "0",
    )  # fmt: skip
    assert await bench_run.run(args) == 0
    assert len(state.target_requests) == 3 and len(state.judge_requests) == 2  # the failed one is not judged
    sent = state.target_requests[0]
    assert sent["headers"]["x-faithproxy-mode"] == "correct" and sent["headers"]["x-faithproxy-detector"] == "prompt"
    assert sent["parts"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert "Right answer: three" in state.judge_requests[0] and "It has two legs." in state.judge_requests[0]

    scores = json.loads((out / "scores.json").read_text())
    assert (scores["model"], scores["answered"], scores["errors"]) == ("vlm", 2, 1)
    metrics = scores["metrics"]
    assert (metrics["open_judged"], metrics["open_unjudged"]) == (2, 1)
    assert metrics["open_accuracy"] == 0.5 and metrics["open_hallu_rate"] == 0.5
    records = bench_run.read_jsonl(out / "predictions.jsonl")
    assert records["freak-3-open"]["error"].startswith("InternalServerError")
    assert records["freak-1-open"]["reasoning"] == "Looking at the image."
    assert records["freak-1-open"]["usage"]["completion_tokens"] == 3

    # resume: only the failed item is asked again, and only it is judged
    state.fail_cars = False
    assert await bench_run.run(args) == 0
    assert len(state.target_requests) == 4 and len(state.judge_requests) == 3
    metrics = json.loads((out / "scores.json").read_text())["metrics"]
    assert (metrics["open_judged"], metrics["open_unjudged"]) == (3, 0)
    assert metrics["open_accuracy"] == pytest.approx(2 / 3)
    judged = bench_run.read_jsonl(out / "judgements.jsonl")
    assert {k: v["judgement"] for k, v in judged.items()} == {
        "freak-1-open": "commonsense_error",
        "freak-2-open": "correct",
        "freak-3-open": "correct",
    }


async def test_every_request_failing_is_exit_status_1(fake: tuple[Fake, str], tmp_path: Path) -> None:
    state, url = fake
    args = parse(
        "--dataset", "freak", "--data-dir", str(write_freak(tmp_path / "data")), "--target", f"{url}/v1",
        "--mode", "vanilla", "--header", "X-Fail=1", "--limit", "2", "--out", str(tmp_path / "out"),
        "--max-retries", "0",
    )  # fmt: skip
    assert await bench_run.run(args) == 1
    assert [r["headers"]["x-faithproxy-mode"] for r in state.target_requests] == ["off", "off"]
    scores = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert (scores["items"], scores["answered"], scores["errors"]) == (2, 0, 2)
    assert scores["metrics"]["accuracy"] == 0.0  # unparseable counts as D: wrong
    assert scores["metrics"]["not_listed_rate"] == 1.0
    assert (tmp_path / "out" / "chains.jsonl").read_text() == ""


async def test_unknown_dataset_and_bad_pairs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("--dataset", "mmpv", "--data-dir", str(tmp_path), "--target", "http://127.0.0.1:9")
    assert await bench_run.run(args) == 2
    assert "Did you mean 'mmvp'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="freak has no option setting; its options: mode, instruction"):
        await bench_run.run(parse("--dataset", "freak", "--data-dir", str(tmp_path), "--target", "http://127.0.0.1:9",
                                  "--loader-arg", "setting=open"))  # fmt: skip
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        await bench_run.run(parse("--dataset", "freak", "--data-dir", str(write_freak(tmp_path)),
                                  "--target", "http://127.0.0.1:9", "--loader-arg", "open"))  # fmt: skip


def test_upr_totals_pool_the_summaries() -> None:
    records = [
        {"faithfulness": {"steps": [{}] * 4, "perception_steps": 3, "unfaithful_detected": 1, "residual": 0,
                          "regenerations": 1, "fixed": 1}},
        {"faithfulness": {"steps": [{}] * 2, "perception_steps": 1, "unfaithful_detected": 1, "residual": 1,
                          "regenerations": 3, "fixed": 0}},
        {"faithfulness": None, "error": "timeout"},
    ]  # fmt: skip
    totals = bench_run.faithfulness_totals(records)
    assert totals == {
        "requests_with_summary": 2, "steps": 6, "perception_steps": 4, "unfaithful_detected": 2, "residual": 1,
        "upr_detected": 0.5, "upr_residual": 0.25, "regenerations": 4, "fixed": 1,
    }  # fmt: skip
    costs = bench_run.cost_totals([
        {"usage": {"prompt_tokens": 10, "completion_tokens": 4}, "latency_s": 1.0},
        {"usage": {"prompt_tokens": 12, "completion_tokens": 6}, "latency_s": 3.0},
        {"usage": None, "latency_s": 2.0},
        {"error": "timeout", "usage": {"prompt_tokens": 99}, "latency_s": 60.0},  # failed: not counted
    ])  # fmt: skip
    assert costs == {"prompt_tokens": 22, "completion_tokens": 10, "latency_s_mean": 2.0, "latency_s_p50": 2.0,
                     "latency_s_p95": 3.0}  # fmt: skip
    assert bench_run.cost_totals([])["latency_s_p50"] is None
    no_perception = bench_run.faithfulness_totals([{"faithfulness": {"steps": [], "perception_steps": 0}}])
    assert no_perception["upr_detected"] is None and no_perception["upr_residual"] is None
    assert bench_run.faithfulness_totals([])["requests_with_summary"] == 0


def test_chain_labels_only_when_the_summary_aligns() -> None:
    from faithproxy.benchmarks.evaluation.datasets import Item, mmvp

    item = Item(id="mmvp-1", question="Q?", prompt="Q? Options: A. x B. y", answer="A", options=("x", "y"))
    summary = {"steps": [
        {"index": 0, "kind": "perception", "verdict": "faithful", "detected": "unfaithful", "regenerated": True,
         "original_text": "The cat is black.", "attempts": 1, "residual": False},
        {"index": 1, "kind": "reasoning", "verdict": "unknown", "detected": "unknown", "regenerated": False,
         "attempts": 0, "residual": False},
    ]}  # fmt: skip
    record = {"text": "The answer is A.", "reasoning": "The cat is white.", "faithfulness": summary, "request_id": "r"}
    chain = bench_run.chain_of(item, record, mmvp, dataset="mmvp", mode="correct")
    assert [(s.text, s.kind, s.faithful) for s in chain.steps] == [
        ("The cat is white.", "perception", True),
        ("The answer is A.", "reasoning", None),
    ]
    assert chain.steps[0].extra["original_text"] == "The cat is black."
    assert chain.extra == {"correct": True, "dataset": "mmvp", "mode": "correct", "request_id": "r",
                           "steps_aligned": True}  # fmt: skip
    record["reasoning"] = "The cat is white. It sits."  # three steps against a summary of two
    chain = bench_run.chain_of(item, record, mmvp, dataset="mmvp", mode="correct")
    assert chain.extra["steps_aligned"] is False and all(s.kind is None and s.faithful is None for s in chain.steps)
