"""The OpenAI-compatible judge's own client (clients/openai_judge.py) on the wire: the request it writes,
the reply it reads (text, log-probabilities, usage), and how each failure becomes a DetectorError,
against a scripted local server (a real uvicorn: the client speaks HTTP/1.1 itself) and the stand-in
judge. tests/clients/test_judges.py runs the same suite through both backends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response

from faithproxy.benchmarks.standins.judge_server import create_app, running_judge_server
from faithproxy.clients.judges import OpenAICompatibleJudge, build_judge
from faithproxy.clients.openai_judge import retry_delay_s
from faithproxy.detectors.judge_confidence import flag_confidence
from faithproxy.detectors.judge_prompt import JUDGE_SYSTEM_PROMPT, build_judge_prompt, build_judge_turn
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode
from faithproxy.faithcore.images import parse_image_url
from faithproxy.testing import running_app
from tests.support import local_judge_config

SECRET = "sk-test-very-secret-0123456789"
IMAGE = parse_image_url("https://example.com/cat.png")
PROMPT = build_judge_prompt("What does the man wear?", ["The man wears a red scarf.", "So he is cold."])
OK = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "[Faithfulness]: FAITHFUL"}}],
    "usage": {"prompt_tokens": 50, "completion_tokens": 6, "prompt_tokens_details": {"cached_tokens": 30}},
}


@dataclass
class Scripted:
    """Replies (status, headers, body, seconds before it) given in order, the last one again and again;
    every request's headers and JSON body are kept."""

    replies: list[tuple[int, dict[str, str], bytes, float]]
    seen: list[tuple[dict[str, str], Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            self.seen.append((dict(request.headers), json.loads(await request.body())))
            status, headers, body, delay = self.replies[min(len(self.seen), len(self.replies)) - 1]
            if delay:
                try:
                    await asyncio.wait_for(self.release.wait(), delay)
                except TimeoutError:
                    pass
            return Response(body, status_code=status, headers=headers, media_type="application/json")

        return app


def reply(status: int = 200, body: Any = OK, headers: dict[str, str] | None = None, delay: float = 0.0) -> Any:
    return (status, headers or {}, body if isinstance(body, bytes) else json.dumps(body).encode(), delay)


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, Scripted]]:
    server = Scripted([reply()])
    async with running_app(server.app(), on_exit=server.release.set) as url:
        yield url, server


async def call(url: str, **overrides: Any) -> Any:
    judge = build_judge(local_judge_config("openai", url, **({"api_key": SECRET} | overrides)))
    try:
        return await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT, [IMAGE])
    finally:
        await judge.aclose()


async def failure(url: str, **overrides: Any) -> DetectorError:
    with pytest.raises(DetectorError) as info:
        await call(url, **overrides)
    assert SECRET not in info.value.message
    return info.value


async def test_the_request_on_the_wire(scripted: tuple[str, Scripted]) -> None:
    url, server = scripted
    await call(url, temperature=0.0, max_tokens=200)
    ((headers, body),) = server.seen
    assert headers["authorization"] == f"Bearer {SECRET}" and headers["content-type"] == "application/json"
    image_part = {"type": "image_url", "image_url": {"url": IMAGE.url}}
    assert body == {
        "model": "judge-model",
        "max_tokens": 200,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": 5,
        "messages": [
            {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
            {"role": "user", "content": [image_part, {"type": "text", "text": PROMPT}]},
        ],
    }
    await call(url, top_logprobs=None)
    assert "temperature" not in server.seen[-1][1] and "logprobs" not in server.seen[-1][1]


async def test_reply_usage_and_logprobs_from_the_stand_in_judge() -> None:
    """Text, log-probabilities (the flag's confidence as the stand-in sets it) and usage with the prefix
    cache's share, read from the JSON; one kept-alive connection serves every call."""
    app = create_app({"unfaithful": ["The man wears a red scarf."]})
    app.state.judge.flag_confidence = 0.8
    turn = build_judge_turn("What does the man wear?", ["A man.", "The man wears a red scarf."], already_checked=1)
    async with running_judge_server(app) as url:
        judge = build_judge(local_judge_config("openai", url))
        assert isinstance(judge, OpenAICompatibleJudge)
        try:
            first = await judge.complete(JUDGE_SYSTEM_PROMPT, turn, [IMAGE])
            second = await judge.complete(JUDGE_SYSTEM_PROMPT, turn, [IMAGE])
            assert len(judge._client._all) == 1  # one connection, kept alive between the calls
        finally:
            await judge.aclose()
    assert "[Faithfulness]: UNFAITHFUL" in first.text and first.tokens is not None
    assert "".join(t.token for t in first.tokens) == first.text
    assert flag_confidence(first.tokens) == pytest.approx(0.8)
    assert first.cached_input_tokens == 0 and second.cached_input_tokens > 0
    assert second.input_tokens + second.cached_input_tokens == first.input_tokens and first.output_tokens > 0
    assert first.usage().prompt_tokens == second.usage().prompt_tokens


async def test_cached_tokens_are_not_fresh_input(scripted: tuple[str, Scripted]) -> None:
    result = await call(scripted[0])
    assert (result.input_tokens, result.cached_input_tokens, result.output_tokens) == (20, 30, 6)
    assert result.tokens is None and result.latency_s > 0


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, DetectorErrorCode.STATUS_4XX), (429, DetectorErrorCode.STATUS_429), (503, DetectorErrorCode.STATUS_5XX)],
)
async def test_an_error_status_is_the_judge_s_error(scripted: tuple[str, Scripted], status: int, code: str) -> None:
    url, server = scripted
    server.replies = [reply(status, {"error": {"message": "no"}})]
    error = await failure(url)
    assert error.code == code and f"HTTP {status}" in error.message and len(server.seen) == 1


async def test_retries_follow_retry_after_and_stop_at_a_success(scripted: tuple[str, Scripted]) -> None:
    url, server = scripted
    server.replies = [reply(503, {}, {"retry-after-ms": "10"}), reply(429, {}, {"retry-after": "0.01"}), reply()]
    assert (await call(url, max_retries=3)).text == "[Faithfulness]: FAITHFUL"
    assert len(server.seen) == 3
    server.seen.clear()
    server.replies = [reply(400, {})]  # a request the judge refuses is not sent again
    assert (await failure(url, max_retries=3)).code == DetectorErrorCode.STATUS_4XX and len(server.seen) == 1


def test_retry_delays() -> None:
    assert retry_delay_s(400, {}, 0) is None and retry_delay_s(404, {"retry-after": "1"}, 0) is None
    assert retry_delay_s(429, {"retry-after": "2"}, 0) == 2.0
    assert retry_delay_s(503, {"retry-after-ms": "250", "retry-after": "9"}, 0) == 0.25
    assert retry_delay_s(429, {"retry-after": "3600"}, 0) is None  # too long to hold a stream for
    for status in (408, 409, 429, 500, 502):
        assert 0.375 <= (retry_delay_s(status, {"retry-after": "soon"}, 0) or 0) <= 0.5
    assert 6.0 <= (retry_delay_s(500, {}, 9) or 0) <= 8.0


async def test_a_silent_judge_is_a_timeout(scripted: tuple[str, Scripted]) -> None:
    url, server = scripted
    server.replies = [reply(delay=30.0)]
    error = await failure(url, timeout_s=0.2, max_retries=1)
    assert error.code == DetectorErrorCode.TIMEOUT and len(server.seen) == 2  # a timeout is tried again


BAD, EMPTY = DetectorErrorCode.BAD_RESPONSE, DetectorErrorCode.EMPTY_REPLY


def choices(content: Any, **more: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"content": content}}], **more}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", BAD),
        (b"\xff\xfe", BAD),
        ([], BAD),
        ({"choices": []}, BAD),
        (choices(["a list"]), BAD),
        (choices("ok", usage={"prompt_tokens": "many"}), BAD),
        ({"choices": [{"message": {"content": "ok"}, "logprobs": {"content": [{"token": "ok"}]}}]}, BAD),
        (choices(None), EMPTY),
        (choices(" \n"), EMPTY),
    ],
)
async def test_a_malformed_reply(scripted: tuple[str, Scripted], body: Any, code: str) -> None:
    url, server = scripted
    server.replies = [reply(body=body)]
    error = await failure(url, max_retries=2)
    assert error.code == code and len(server.seen) == 1  # the same reply would come again: no retry


async def test_a_closed_judge_refuses_calls(scripted: tuple[str, Scripted]) -> None:
    judge = build_judge(local_judge_config("openai", scripted[0]))
    await judge.aclose()
    with pytest.raises(DetectorError) as info:
        await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
    assert info.value.code == DetectorErrorCode.CONNECTION
