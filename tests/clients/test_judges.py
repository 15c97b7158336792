"""Judge backends through the real anthropic and openai SDKs against the local judge server.

The server is a real uvicorn on 127.0.0.1 (a free port); fault modes are switched on its state.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import SecretStr, ValidationError

from faithproxy.benchmarks.standins.judge_server import (
    GARBAGE_REPLY,
    JudgeServerState,
    create_app,
    running_judge_server,
)
from faithproxy.clients.anthropic_judge import AnthropicJudge, text_blocks
from faithproxy.clients.judge_base import TextBlock, TokenCounts
from faithproxy.clients.judges import (
    BACKENDS,
    JudgeBackend,
    JudgeConfig,
    OpenAICompatibleJudge,
    build_judge,
    build_judges,
)
from faithproxy.clients.openai_judge import read_reply
from faithproxy.detectors.judge_prompt import JUDGE_SYSTEM_PROMPT, build_judge_prompt, build_judge_turn
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode
from faithproxy.faithcore.images import parse_image_url
from faithproxy.testing import running_app
from tests.support import local_judge_config

PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
DATA_IMAGE = parse_image_url(f"data:image/png;base64,{PNG_1PX}")
URL_IMAGE = parse_image_url("https://example.com/cat.png")
SECRET = "sk-test-very-secret-0123456789"
PROMPT = build_judge_prompt("What does the man wear?", ["The man wears a red scarf.", "So he is cold."])


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, JudgeServerState]]:
    app = create_app({"unfaithful": ["The man wears a red scarf."]})
    async with running_judge_server(app) as url:
        yield url, app.state.judge


def config(backend: str, url: str, **overrides: object) -> JudgeConfig:
    return local_judge_config(backend, url, **({"api_key": SECRET} | overrides))


@pytest.fixture(params=["anthropic", "openai"])
async def judge(request: pytest.FixtureRequest, server: tuple[str, JudgeServerState]) -> AsyncIterator[JudgeBackend]:
    backend = build_judge(config(request.param, server[0]))
    yield backend
    await backend.aclose()


async def test_reply_usage_and_latency(judge: JudgeBackend, server: tuple[str, JudgeServerState]) -> None:
    result = await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT, [DATA_IMAGE])
    assert "[Faithfulness]: UNFAITHFUL" in result.text
    assert result.text.endswith("[First unfaithful sentence]: 1")  # the incremental protocol names it by number
    assert result.input_tokens > 0 and result.output_tokens > 0 and result.latency_s > 0
    last = server[1].last_request
    assert last is not None and last["model"] == "judge-model" and last["has_system"]


TURN = build_judge_turn(
    "What does the man wear?", ["A man stands by a bike.", "The man wears a red scarf."], already_checked=1
)


async def test_anthropic_sends_cache_breakpoints_and_records_cache_tokens(server: tuple[str, JudgeServerState]) -> None:
    """The marked blocks reach the Messages API as cache_control breakpoints; the second call of the same
    prefix reads what the first wrote, and both counts come back through the SDK's usage."""
    judge = build_judge(config("anthropic", server[0]))
    try:
        first = await judge.complete(JUDGE_SYSTEM_PROMPT, TURN, [DATA_IMAGE])
        second = await judge.complete(JUDGE_SYSTEM_PROMPT, TURN, [DATA_IMAGE])
    finally:
        await judge.aclose()
    assert server[1].last_request is not None and server[1].last_request["cache_control"] == 3
    assert first.cache_creation_tokens > 0 and first.cached_input_tokens == 0
    assert second.cached_input_tokens == first.cache_creation_tokens and second.cache_creation_tokens == 0
    assert second.input_tokens == first.input_tokens  # the request line after the last breakpoint
    assert second.usage().prompt_tokens == first.usage().prompt_tokens


def test_anthropic_keeps_at_most_four_breakpoints() -> None:
    blocks = text_blocks([TextBlock(f"b{i}", cache=True) for i in range(6)])
    assert [("cache_control" in b) for b in blocks] == [True] * 4 + [False] * 2
    assert text_blocks([TextBlock("plain")]) == [{"type": "text", "text": "plain"}]


async def test_openai_joins_blocks_and_records_cached_tokens(server: tuple[str, JudgeServerState]) -> None:
    """One text part whatever the blocks (vLLM caches by tokens, not blocks); the cached share of the
    prompt comes from usage.prompt_tokens_details and is not counted as fresh input."""
    judge = build_judge(config("openai", server[0]))
    try:
        first = await judge.complete(JUDGE_SYSTEM_PROMPT, TURN, [DATA_IMAGE])
        second = await judge.complete(JUDGE_SYSTEM_PROMPT, TURN, [DATA_IMAGE])
    finally:
        await judge.aclose()
    assert server[1].last_request is not None and server[1].last_request["cache_control"] == 0
    assert first.cached_input_tokens == 0 and second.cached_input_tokens > 0
    assert second.input_tokens + second.cached_input_tokens == first.input_tokens
    assert second.cache_creation_tokens == 0


def test_openai_usage_without_details_counts_everything_fresh() -> None:
    """vLLM without --enable-prompt-tokens-details sends no details: nothing is taken as cached."""
    reply = {
        "choices": [{"message": {"content": "ok"}}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 7, "prompt_tokens_details": None},
    }
    assert read_reply(reply) == ("ok", TokenCounts(input_tokens=120, output_tokens=7))


async def test_anthropic_image_blocks(server: tuple[str, JudgeServerState]) -> None:
    judge = build_judge(config("anthropic", server[0]))
    try:
        await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT, [DATA_IMAGE, URL_IMAGE])
    finally:
        await judge.aclose()
    assert server[1].last_request is not None
    assert server[1].last_request["images"] == [
        {"source": "base64", "media_type": "image/png"},
        {"source": "url", "media_type": None},
    ]


async def test_openai_image_parts(server: tuple[str, JudgeServerState]) -> None:
    judge = build_judge(config("openai", server[0]))
    try:
        await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT, [DATA_IMAGE, URL_IMAGE])
    finally:
        await judge.aclose()
    assert server[1].last_request is not None
    assert server[1].last_request["images"] == [{"source": "data"}, {"source": "url"}]


async def test_pooled_client_is_reused(judge: JudgeBackend, server: tuple[str, JudgeServerState]) -> None:
    client = judge._client  # type: ignore[attr-defined]
    for _ in range(3):
        await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
    assert judge._client is client  # type: ignore[attr-defined]
    assert server[1].requests == 3


@pytest.mark.parametrize(("mode", "code"), [("500", "status_5xx"), ("429", "status_429"), ("badjson", "bad_response")])
async def test_server_faults_become_detector_errors(
    judge: JudgeBackend, server: tuple[str, JudgeServerState], mode: str, code: str
) -> None:
    server[1].mode = mode  # type: ignore[assignment]
    with pytest.raises(DetectorError) as info:
        await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
    assert info.value.code == code
    assert judge.name in info.value.message and SECRET not in info.value.message


async def test_garbage_is_returned_as_text(judge: JudgeBackend, server: tuple[str, JudgeServerState]) -> None:
    """Backends move text; deciding that a reply is garbage is the parser's job."""
    server[1].mode = "garbage"
    assert (await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)).text == GARBAGE_REPLY


@pytest.mark.parametrize("backend", ["anthropic", "openai"])
async def test_hang_becomes_timeout(backend: str, server: tuple[str, JudgeServerState]) -> None:
    server[1].mode = "hang"
    judge = build_judge(config(backend, server[0], timeout_s=0.3))
    try:
        with pytest.raises(DetectorError) as info:
            await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
    finally:
        await judge.aclose()
    assert info.value.code == "timeout"


@pytest.mark.parametrize("backend", ["anthropic", "openai"])
async def test_unreachable_server_is_a_connection_error(backend: str) -> None:
    app = create_app({})
    async with running_judge_server(app) as url:
        pass  # the port is free again: nothing listens there now
    judge = build_judge(config(backend, url, timeout_s=1.0))
    try:
        with pytest.raises(DetectorError) as info:
            await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
    finally:
        await judge.aclose()
    assert info.value.code == "connection"


@pytest.mark.parametrize("backend", ["anthropic", "openai"])
async def test_max_retries_is_passed_to_the_sdk(backend: str, server: tuple[str, JudgeServerState]) -> None:
    server[1].mode = "500"
    judge = build_judge(config(backend, server[0], max_retries=1))
    try:
        with pytest.raises(DetectorError):
            await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
    finally:
        await judge.aclose()
    assert server[1].requests == 2


async def test_keys_stay_out_of_repr_and_logs(
    judge: JudgeBackend, server: tuple[str, JudgeServerState], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
    server[1].mode = "429"
    with pytest.raises(DetectorError) as info:
        await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
    for text in (repr(judge), str(judge), repr(judge.config), str(judge.config), str(info.value), caplog.text):
        assert SECRET not in text
    assert "judge-model" in repr(judge)


def test_config_validation_and_key_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_JUDGE_KEY", SECRET)
    by_env = JudgeConfig(name="j", backend="openai", model="m", api_key_env="MY_JUDGE_KEY")
    assert by_env.resolved_api_key() == SECRET
    direct = JudgeConfig(name="j", backend="anthropic", model="m", api_key=SecretStr(SECRET))
    assert direct.resolved_api_key() == SECRET
    monkeypatch.delenv("MY_JUDGE_KEY")
    with pytest.raises(ValueError, match="MY_JUDGE_KEY"):
        build_judge(by_env)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY"):
        build_judge(JudgeConfig(name="j", backend="anthropic", model="m"))
    for bad in ({"backend": "gemini"}, {"timeout_s": 0}, {"max_retries": -1}, {"name": "has space"}, {"x": 1}):
        with pytest.raises(ValidationError):
            JudgeConfig.model_validate({"name": "j", "backend": "openai", "model": "m", **bad})


async def test_build_judges_by_name() -> None:
    judges = build_judges(
        [
            JudgeConfig(name="claude", backend="anthropic", model="m", api_key=SECRET),
            JudgeConfig(name="qwen", backend="openai", model="m", api_key="EMPTY"),
        ]
    )
    try:
        assert isinstance(judges["claude"], AnthropicJudge)
        assert isinstance(judges["qwen"], OpenAICompatibleJudge)
    finally:
        for judge in judges.values():
            await judge.aclose()
    with pytest.raises(ValueError, match="two judges"):
        build_judges([JudgeConfig(name="a", backend="openai", model="m", api_key="k")] * 2)


async def test_server_control_endpoint_switches_modes(server: tuple[str, JudgeServerState]) -> None:
    async with httpx.AsyncClient(base_url=server[0]) as client:
        state = (await client.post("/_control", json={"mode": "429", "latency_s": 0.01})).json()
        assert state == {"mode": "429", "latency_s": 0.01, "obey_checked": True}
    judge = build_judge(config("openai", server[0]))
    try:
        with pytest.raises(DetectorError, match="status_429"):
            await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
    finally:
        await judge.aclose()


def test_backend_names_are_the_registry_s() -> None:
    assert set(typing.get_args(JudgeConfig.model_fields["backend"].annotation)) == set(BACKENDS)
    assert BACKENDS.resolve("anthropic") is AnthropicJudge and BACKENDS.resolve("openai") is OpenAICompatibleJudge


@pytest.mark.parametrize("status", [400, 401, 404, 422])
@pytest.mark.parametrize("backend", ["anthropic", "openai"])
async def test_a_judge_answering_4xx_is_status_4xx(backend: str, status: int) -> None:
    """One reason for every 4xx but 429 (a small label set); the number stays in the message."""
    app = FastAPI()

    @app.post("/{path:path}")
    async def refuse(path: str) -> JSONResponse:
        return JSONResponse({"error": {"type": "refused", "message": "no"}}, status_code=status)

    async with running_app(app) as url:
        judge = build_judge(config(backend, url + ("/v1" if backend == "openai" else ""), max_retries=0))
        try:
            with pytest.raises(DetectorError) as info:
                await judge.complete(JUDGE_SYSTEM_PROMPT, PROMPT)
        finally:
            await judge.aclose()
    assert info.value.code is DetectorErrorCode.STATUS_4XX and f"HTTP {status}" in info.value.message
