"""The local judge server: its oracle, both wire protocols, stats, control and its command line."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import create_app, running_judge_server
from faithproxy.benchmarks.standins.oracle import Oracle
from faithproxy.benchmarks.standins.prompt_cache import VLLM_BLOCK, Usage
from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.benchmarks.tinyvlm.processes import free_port
from faithproxy.clients.anthropic_judge import text_blocks
from faithproxy.clients.judge_base import TextBlock
from faithproxy.detectors.judge_prompt import build_judge_prompt, build_judge_turn, parse_judge_reply
from faithproxy.faithcore.types import StepKind

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 120  # bounds a wait that must end by an event; no figure of a test depends on it
ORACLE = {"unfaithful": ["The cat is green."], "reasoning": ["The cat is likely hungry."], "description": "A cat."}
CHAIN = ["A cat sits on a mat.", "The cat is green.", "The cat is likely hungry.", "So the answer is B."]
PROMPT = build_judge_prompt("What colour is the cat?", CHAIN)


def anthropic_body(text: str) -> dict[str, object]:
    return {
        "model": "claude-test",
        "max_tokens": 256,
        "system": "judge",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/c.png"}},
                    {"type": "text", "text": text},
                ],
            }
        ],
    }


def openai_body(text: str) -> dict[str, object]:
    return {
        "model": "qwen-test",
        "messages": [
            {"role": "system", "content": "judge"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "text", "text": text},
                ],
            },
        ],
    }


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ORACLE)
    async with running_judge_server(app) as url, httpx.AsyncClient(base_url=url, timeout=5) as http:
        yield http


def test_oracle_typing_and_reply() -> None:
    oracle = Oracle.from_mapping(ORACLE)
    assert oracle.is_unfaithful('  "the cat is GREEN" ')
    kinds = [oracle.kind(s) for s in CHAIN]
    assert kinds == [StepKind.PERCEPTION, StepKind.PERCEPTION, StepKind.REASONING, StepKind.REASONING]
    assert oracle.kind("3 + 4 = 7 apples in total.") is StepKind.REASONING
    reply = parse_judge_reply(oracle.reply(CHAIN), CHAIN)
    assert reply.first_unfaithful == 1 and reply.description == "A cat."
    assert reply.kinds == dict(enumerate(kinds))
    assert parse_judge_reply(oracle.reply(CHAIN, already_checked=2), CHAIN).first_unfaithful is None
    assert parse_judge_reply(Oracle().reply(CHAIN), CHAIN).first_unfaithful is None


def test_oracle_file(tmp_path: Path) -> None:
    path = tmp_path / "oracle.json"
    path.write_text(json.dumps(ORACLE), encoding="utf-8")
    assert Oracle.load(path) == Oracle.from_mapping(ORACLE)
    assert create_app(str(path)).state.judge.oracle == Oracle.from_mapping(ORACLE)


async def test_anthropic_wire_format(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/messages", json=anthropic_body(PROMPT))
    assert response.status_code == 200
    body = response.json()
    assert body["type"] == "message" and body["role"] == "assistant" and body["model"] == "claude-test"
    assert body["stop_reason"] == "end_turn" and body["id"].startswith("msg_")
    assert set(body["usage"]) == {"input_tokens", "output_tokens"}
    assert parse_judge_reply(body["content"][0]["text"], CHAIN).first_unfaithful == 1


async def test_openai_wire_format(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=openai_body(PROMPT))
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == "qwen-test"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    assert parse_judge_reply(choice["message"]["content"], CHAIN).first_unfaithful == 1
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


async def test_stats_count_requests_and_judged_sentences(client: httpx.AsyncClient) -> None:
    await client.post("/v1/messages", json=anthropic_body(PROMPT))
    await client.post("/v1/chat/completions", json=openai_body(build_judge_prompt("q", CHAIN, already_checked=3)))
    stats = (await client.get("/_stats")).json()
    assert stats["requests"] == 2 and stats["sentences_judged"] == 4 + 1
    assert stats["by_protocol"] == {"anthropic": 1, "openai": 1}
    assert stats["last_request"]["images"] == [{"source": "data"}]
    assert stats["last_request"]["already_checked"] == 3
    await client.post("/_control", json={"reset_stats": True})
    assert (await client.get("/_stats")).json()["requests"] == 0


async def test_errors_use_each_protocols_format(client: httpx.AsyncClient) -> None:
    await client.post("/_control", json={"mode": "429"})
    anthropic = await client.post("/v1/messages", json=anthropic_body(PROMPT))
    assert anthropic.status_code == 429 and anthropic.json()["error"]["type"] == "rate_limit_error"
    await client.post("/_control", json={"mode": "500"})
    openai = await client.post("/v1/chat/completions", json=openai_body(PROMPT))
    assert openai.status_code == 500 and "message" in openai.json()["error"]


async def test_not_a_judge_prompt_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=openai_body("hello"))
    assert response.status_code == 400


async def test_control_validates(client: httpx.AsyncClient) -> None:
    assert (await client.post("/_control", json={"mode": "explode"})).status_code == 422
    assert (await client.post("/_control", json={"latency_s": -1})).status_code == 422


async def test_hang_is_released_when_the_server_stops() -> None:
    app = create_app(ORACLE)
    app.state.judge.mode = "hang"
    app.state.judge.hang_s = 3600.0  # only the release at shutdown can end the hang while the test runs

    async def serve_one_hung_call() -> None:
        async with running_judge_server(app) as url, httpx.AsyncClient(base_url=url) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/v1/messages", json=anthropic_body(PROMPT), timeout=0.2)

    # A shutdown that waited for the hung call would wait the hour: the guard turns that into a failure.
    await asyncio.wait_for(serve_one_hung_call(), HANG_GUARD_S)
    assert app.state.judge.release.is_set()


def test_command_line(tmp_path: Path) -> None:
    oracle = tmp_path / "oracle.json"
    oracle.write_text(json.dumps(ORACLE), encoding="utf-8")
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "faithproxy.benchmarks.standins.judge_server",
        "--port",
        str(port),
        "--oracle",
        str(oracle),
    ]
    url = f"http://127.0.0.1:{port}"
    # start() fails with the server's log if it exits or /_stats does not answer within 30 s
    with processes.start(
        [*command, "--latency-s", "0.01"],
        tmp_path / "server.log",
        f"{url}/_stats",
        name="judge server",
        timeout_s=30,
        cwd=ROOT,
    ):
        reply = httpx.post(f"{url}/v1/chat/completions", json=openai_body(PROMPT), timeout=5).json()
        assert "[Faithfulness]: UNFAITHFUL" in reply["choices"][0]["message"]["content"]
        assert httpx.get(f"{url}/_stats", timeout=5).json()["requests"] == 1


# ------------------------------------------------------------------ the incremental protocol, caching, timing


def test_reply_describes_only_when_asked_and_types_only_the_checked_sentences() -> None:
    oracle = Oracle.from_mapping(ORACLE)
    reply = oracle.reply(CHAIN, already_checked=2, describe=False)
    assert reply == "Sentence 3: REASONING\nSentence 4: REASONING\n[Faithfulness]: FAITHFUL"
    flagged = oracle.reply(CHAIN, already_checked=1)
    assert flagged.startswith("[Image description]: A cat.\nSentence 2: PERCEPTION\n")
    assert flagged.endswith("[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: 2")


def messages_body(blocks: list[TextBlock]) -> dict[str, object]:
    content = text_blocks(blocks)
    return {"model": "m", "max_tokens": 64, "system": "judge", "messages": [{"role": "user", "content": content}]}


async def test_messages_api_honours_cache_control_with_its_look_back(client: httpx.AsyncClient) -> None:
    first_turn = build_judge_turn("What colour is the cat?", CHAIN[:2], already_checked=1, ask_description=True)
    usage = (await client.post("/v1/messages", json=messages_body(first_turn))).json()["usage"]
    assert usage["cache_read_input_tokens"] == 0 and usage["cache_creation_input_tokens"] > 0
    # the next call puts the description after the question: its chain breakpoints miss, but the look-back
    # finds the question's block boundary, which the first call wrote
    later = build_judge_turn("What colour is the cat?", CHAIN, already_checked=2, description="A cat.", splits={1})
    usage2 = (await client.post("/v1/messages", json=messages_body(later))).json()["usage"]
    question_tokens = len(first_turn[0].text) // 4 + len("judge") // 4 or 1
    assert 0 < usage2["cache_read_input_tokens"] <= question_tokens + 2
    assert usage2["cache_creation_input_tokens"] > 0
    # the same call again: everything up to the last breakpoint is read
    usage3 = (await client.post("/v1/messages", json=messages_body(later))).json()["usage"]
    read, written = usage2["cache_read_input_tokens"], usage2["cache_creation_input_tokens"]
    assert usage3["cache_read_input_tokens"] == read + written
    assert usage3["cache_creation_input_tokens"] == 0 and usage3["input_tokens"] == usage2["input_tokens"]
    stats = (await client.get("/_stats")).json()
    assert stats["tokens"]["cached_input_tokens"] == read + usage3["cache_read_input_tokens"]
    assert stats["last_request"]["cache_control"] == 3


async def test_chat_completions_cache_prefixes_like_vllm(client: httpx.AsyncClient) -> None:
    body = openai_body(PROMPT)
    first = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
    again = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached % VLLM_BLOCK == 0 and first["prompt_tokens"] - VLLM_BLOCK <= cached < first["prompt_tokens"]
    other = openai_body(build_judge_prompt("Which cat?", CHAIN))  # same system and image, another question
    partial = (await client.post("/v1/chat/completions", json=other)).json()["usage"]
    assert 0 < partial["prompt_tokens_details"]["cached_tokens"] < cached


def test_latency_follows_the_token_timing() -> None:
    state = create_app(ORACLE, 0.2, input_token_s=0.001, output_token_s=0.02).state.judge
    assert state.reply_seconds(Usage(input_tokens=100, output_tokens=10, cached=5000, created=50)) == pytest.approx(
        0.2 + 0.001 * 150 + 0.02 * 10
    )


async def test_control_sets_the_token_timing_and_stats_show_it(client: httpx.AsyncClient) -> None:
    state = (await client.post("/_control", json={"input_token_s": 0.0001, "output_token_s": 0.001})).json()
    assert state == {"latency_s": 0.0, "mode": "ok", "obey_checked": True}
    stats = (await client.get("/_stats")).json()
    assert stats["latency_model"] == {"fixed_s": 0.0, "input_token_s": 0.0001, "output_token_s": 0.001}
    await client.post("/v1/chat/completions", json=openai_body(build_judge_prompt("q", CHAIN, ask_description=True)))
    assert (await client.get("/_stats")).json()["descriptions"] == 1
    await client.post("/_control", json={"reset_stats": True})
    stats = (await client.get("/_stats")).json()
    assert stats["descriptions"] == 0 and stats["tokens"]["input_tokens"] == 0
