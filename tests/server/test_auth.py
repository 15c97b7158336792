"""Client API keys (server/admission/auth.py) and the separation of the three kinds of keys.

The proxy runs for real (uvicorn on 127.0.0.1); vLLM is a MockTransport that records what it is sent;
the judge is the local judge server on 127.0.0.1 with a recorder of the headers it receives.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.clients.judges import JudgeConfig
from faithproxy.clients.vllm import CHAT_PATH as CHAT
from faithproxy.server.admission.auth import APIKeyMiddleware
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, frames, metric, running_app

CLIENT_KEY = "fp-client-key-0123456789abcdef"
OTHER_CLIENT_KEY = "fp-second-client-key-zyxwvu"
UPSTREAM_KEY = "vllm-upstream-key-9f8e7d6c5b4a"
JUDGE_KEY = "sk-judge-key-a1b2c3d4e5f6"
BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}]}
NO_DETECTOR = {"x-faithproxy-detector": "none"}


@contextlib.asynccontextmanager
async def proxy(tmp_path: Path, vllm: FakeUpstream | None = None, **overrides: Any) -> AsyncIterator[str]:
    settings = Settings(
        upstream_url="http://vllm.test",
        trace_path=str(tmp_path / "traces.jsonl"),
        api_keys=[CLIENT_KEY, OTHER_CLIENT_KEY],
        **overrides,
    )
    app = create_app(settings, upstream_transport=(vllm or FakeUpstream()).transport())
    async with running_app(app) as url:
        yield url


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "Missing API key"),
        (bearer("wrong-key"), "Incorrect API key"),
        (bearer(CLIENT_KEY[:-1]), "Incorrect API key"),  # a prefix is not the key
        ({"authorization": f"Basic {CLIENT_KEY}"}, "Missing API key"),
        ({"authorization": "Bearer"}, "Missing API key"),
    ],
)
async def test_missing_or_wrong_key_is_401_in_openai_format(
    tmp_path: Path, headers: dict[str, str], message: str
) -> None:
    vllm = FakeUpstream()
    async with proxy(tmp_path, vllm) as url, httpx.AsyncClient() as http:
        response = await http.post(f"{url}/v1/chat/completions", json=BODY, headers={**NO_DETECTOR, **headers})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert error["message"].startswith(message) and CLIENT_KEY not in response.text
    assert not [r for r in vllm.requests if r.url.path == "/v1/chat/completions"]  # nothing went upstream


@pytest.mark.parametrize("key", [CLIENT_KEY, OTHER_CLIENT_KEY])
async def test_any_configured_key_is_accepted(tmp_path: Path, key: str) -> None:
    async with proxy(tmp_path) as url, httpx.AsyncClient() as http:
        response = await http.post(
            f"{url}/v1/chat/completions", json=BODY, headers={**NO_DETECTOR, "authorization": f"bearer {key}"}
        )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"].startswith("The image shows")


async def test_probes_and_metrics_are_open_everything_else_is_not(tmp_path: Path) -> None:
    async with proxy(tmp_path) as url, httpx.AsyncClient() as http:
        assert (await http.get(f"{url}/healthz")).status_code == 200
        assert (await http.get(f"{url}/readyz")).status_code == 200
        assert (await http.get(f"{url}/metrics")).status_code == 200
        for path in ("/v1/models", "/openapi.json", "/docs"):
            assert (await http.get(f"{url}{path}")).status_code == 401, path
        assert (await http.get(f"{url}/v1/models", headers=bearer(CLIENT_KEY))).status_code == 200
        metrics = (await http.get(f"{url}/metrics")).text
    assert metric(metrics, "faithproxy_requests_total", mode="rejected") == 0  # GETs only


async def test_metrics_can_require_the_key(tmp_path: Path) -> None:
    async with proxy(tmp_path, metrics_require_key=True) as url, httpx.AsyncClient() as http:
        assert (await http.get(f"{url}/metrics")).status_code == 401
        assert (await http.get(f"{url}/healthz")).status_code == 200
        assert (await http.post(f"{url}/v1/chat/completions", json=BODY, headers=NO_DETECTOR)).status_code == 401
        metrics = await http.get(f"{url}/metrics", headers=bearer(CLIENT_KEY))
    assert metrics.status_code == 200
    assert metric(metrics.text, "faithproxy_requests_total", mode="rejected", status="4xx", endpoint=CHAT) == 1


async def test_no_keys_configured_means_no_auth(tmp_path: Path) -> None:
    app = create_app(Settings(upstream_url="http://vllm.test"), upstream_transport=FakeUpstream().transport())
    async with running_app(app) as url, httpx.AsyncClient() as http:
        response = await http.post(f"{url}/v1/chat/completions", json=BODY, headers=NO_DETECTOR)
    assert response.status_code == 200


def test_keys_from_the_environment_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAITHPROXY_API_KEYS", f" {CLIENT_KEY}, {OTHER_CLIENT_KEY},, ")
    settings = Settings()
    assert [k.get_secret_value() for k in settings.api_keys] == [CLIENT_KEY, OTHER_CLIENT_KEY]
    assert CLIENT_KEY not in repr(settings) and CLIENT_KEY not in str(settings.model_dump())


def test_middleware_compares_every_key() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:  # pragma: no cover - never reached
        raise AssertionError

    middleware = APIKeyMiddleware(app, [CLIENT_KEY, OTHER_CLIENT_KEY])
    assert middleware.valid(CLIENT_KEY.encode()) and middleware.valid(OTHER_CLIENT_KEY.encode())
    assert not middleware.valid(b"") and not middleware.valid(CLIENT_KEY.encode() + b"x")
    with pytest.raises(ValueError):
        APIKeyMiddleware(app, [])


class HeaderRecorder:
    """ASGI middleware that keeps every request's headers (the judge server's view of the proxy)."""

    def __init__(self, app: ASGIApp, seen: list[dict[str, str]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


@pytest.mark.parametrize("backend", ["anthropic", "openai"])
async def test_keys_go_only_to_their_party_and_never_into_traces_or_logs(
    tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # everything any library logs, the SDKs' debug output included
    judge_headers: list[dict[str, str]] = []
    judge_app = create_judge_app({"unfaithful": []})
    judge_app.add_middleware(HeaderRecorder, seen=judge_headers)
    vllm = FakeUpstream()
    async with running_judge_server(judge_app) as judge_url:
        judge = JudgeConfig(
            name="j",
            backend=backend,  # type: ignore[arg-type]
            model="judge-model",
            base_url=judge_url if backend == "anthropic" else f"{judge_url}/v1",
            api_key=JUDGE_KEY,  # type: ignore[arg-type]
            timeout_s=5,
            max_retries=0,
        )
        async with proxy(tmp_path, vllm, upstream_api_key=UPSTREAM_KEY, judges=[judge]) as url:
            async with httpx.AsyncClient(timeout=10) as http:
                for stream in (False, True):
                    response = await http.post(
                        f"{url}/v1/chat/completions", json={**BODY, "stream": stream}, headers=bearer(CLIENT_KEY)
                    )
                    assert response.status_code == 200, response.text
                off = await http.post(
                    f"{url}/v1/chat/completions", json=BODY, headers={**bearer(CLIENT_KEY), "x-faithproxy-mode": "off"}
                )
                assert off.status_code == 200
                metrics = (await http.get(f"{url}/metrics")).text
    assert frames(response.text)[-1] == "[DONE]"
    assert judge_headers, "the judge was never called"

    # vLLM sees the upstream key and nothing else
    assert vllm.requests
    for request in vllm.requests:
        assert request.headers.get("authorization") == f"Bearer {UPSTREAM_KEY}"
        dumped = str(request.headers.raw) + request.content.decode(errors="replace")
        assert CLIENT_KEY not in dumped and JUDGE_KEY not in dumped
    # the judge sees its own key and nothing else
    for headers in judge_headers:
        dumped = str(headers)
        assert JUDGE_KEY in dumped
        assert CLIENT_KEY not in dumped and UPSTREAM_KEY not in dumped
    # traces, logs and metrics hold none of them
    written = (tmp_path / "traces.jsonl").read_text() + caplog.text + metrics
    assert len((tmp_path / "traces.jsonl").read_text().splitlines()) == 3
    for key in (CLIENT_KEY, OTHER_CLIENT_KEY, UPSTREAM_KEY, JUDGE_KEY):
        assert key not in written
