"""Policy per API key (server/admission/key_policy.py): keys × headers against the real server (uvicorn on
127.0.0.1, vLLM a FakeUpstream), reload on SIGHUP without dropping a stream, a broken reload keeping the
policies in force; and the loader and checks on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.clients.judges import JudgeConfig
from faithproxy.faithcore.errors import PolicyForbidden
from faithproxy.server.admission.key_policy import KeyPolicy, PolicyFileError, load_book, within
from faithproxy.server.admission.policy import policy_from_headers
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, frames, metric, running_app

PLAIN_KEY = "fp-plain-key-0123456789"  # FAITHPROXY_API_KEYS: the default policy
MOBILE_KEY = "fp-mobile-key-abcdef0123"  # from the environment (key_env)
STRICT_KEY = "fp-strict-key-9876543210"
OPS_KEY = "fp-ops-key-aaaabbbbcccc"
LATE_KEY = "fp-late-key-added-at-reload"
BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}]}

POLICY = f"""
default: {{modes: [correct, detect]}}
keys:
  - name: mobile-app
    key_env: FP_TEST_MOBILE_KEY
    modes: [correct]
    detectors: [none]
    judges: [j1]
    retries: {{min: 1, max: 5}}
    max_judge_budget: 20000
    hints: false
  - name: strict
    key: "{STRICT_KEY}"
    retries: {{min: 4, max: 5}}
  - name: ops
    key: "{OPS_KEY}"
"""


def bearer(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


@contextlib.asynccontextmanager
async def proxy(tmp_path: Path, policy: str, upstream: FakeUpstream) -> AsyncIterator[str]:
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    judge = JudgeConfig(
        name="j1", backend="openai", model="jm", base_url="http://127.0.0.1:9/v1", api_key="sk-j", max_retries=0
    )  # type: ignore[arg-type]
    judge2 = judge.model_copy(update={"name": "j2"})
    settings = Settings(
        upstream_url="http://vllm.test",
        api_keys=[PLAIN_KEY],
        default_detector="none",
        judges=[judge, judge2],
        hint_judge="j1",
        policy_file=str(path),
    )
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        yield url


@pytest.fixture(autouse=True)
def mobile_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FP_TEST_MOBILE_KEY", MOBILE_KEY)


# (key, headers, status, the header a 403 names)
MATRIX: list[tuple[str | None, dict[str, str], int, str | None]] = [
    (None, {}, 401, None),
    ("not-a-key", {}, 401, None),
    (PLAIN_KEY, {}, 200, None),
    (PLAIN_KEY, {"x-faithproxy-mode": "detect"}, 200, None),
    (PLAIN_KEY, {"x-faithproxy-mode": "off"}, 403, "x-faithproxy-mode"),  # off mode's own door
    (PLAIN_KEY, {"x-faithproxy-max-retries": "0"}, 200, None),
    (MOBILE_KEY, {}, 200, None),
    (MOBILE_KEY, {"x-faithproxy-mode": "detect"}, 403, "x-faithproxy-mode"),
    (MOBILE_KEY, {"x-faithproxy-mode": "off"}, 403, "x-faithproxy-mode"),
    (MOBILE_KEY, {"x-faithproxy-detector": "judge"}, 403, "x-faithproxy-detector"),
    (MOBILE_KEY, {"x-faithproxy-max-retries": "0"}, 403, "x-faithproxy-max-retries"),
    (MOBILE_KEY, {"x-faithproxy-max-retries": "6"}, 403, "x-faithproxy-max-retries"),
    (MOBILE_KEY, {"x-faithproxy-max-retries": "5"}, 200, None),
    (MOBILE_KEY, {"x-faithproxy-hints": "true"}, 403, "x-faithproxy-hints"),
    (MOBILE_KEY, {"x-faithproxy-judge-budget": "30000"}, 403, "x-faithproxy-judge-budget"),
    (MOBILE_KEY, {"x-faithproxy-judge-budget": "100"}, 200, None),
    (MOBILE_KEY, {"x-faithproxy-mode": "bogus"}, 400, "x-faithproxy-mode"),  # invalid before forbidden
    (STRICT_KEY, {}, 403, "x-faithproxy-max-retries"),  # the server's default (3) is outside 4..5
    (STRICT_KEY, {"x-faithproxy-max-retries": "4"}, 200, None),
    (STRICT_KEY, {"x-faithproxy-mode": "off"}, 200, None),  # off runs no retry: only modes limits it
    (OPS_KEY, {"x-faithproxy-mode": "off"}, 200, None),
    (OPS_KEY, {"x-faithproxy-detector": "judge", "x-faithproxy-mode": "detect", "x-faithproxy-judge": "j2"}, 0, None),
]


async def test_keys_by_headers(tmp_path: Path) -> None:
    upstream = FakeUpstream()
    async with proxy(tmp_path, POLICY, upstream) as url, httpx.AsyncClient(timeout=10) as http:
        seen = []
        for key, headers, status, param in MATRIX:
            if status == 0:  # the judge is down: admitted by the policy, not a 4xx
                continue
            for stream in (False, True):
                response = await http.post(
                    f"{url}/v1/chat/completions", json={**BODY, "stream": stream}, headers={**bearer(key), **headers}
                )
                seen.append((key, headers, stream, response.status_code))
                assert response.status_code == status, (key, headers, stream, response.text)
                if status >= 400:
                    error = response.json()["error"]
                    assert error["type"] == "invalid_request_error"
                    if param is not None:
                        assert error["param"] == param
                if status == 403:
                    assert error["code"] == "forbidden_by_policy"
                    assert "Allowed:" in error["message"] and param in error["message"]
                    assert MOBILE_KEY not in error["message"] and STRICT_KEY not in error["message"]
        exposition = (await http.get(f"{url}/metrics")).text
    served = sum(1 for *_, status in seen if status == 200)
    assert len([r for r in upstream.requests if r.url.path == "/v1/chat/completions"]) == served
    refused_mobile = 2 * sum(1 for key, _, status, _ in MATRIX if key == MOBILE_KEY and status == 403)
    assert metric(exposition, "faithproxy_policy_requests_total", policy="mobile-app", outcome="refused") == (
        refused_mobile
    )
    assert metric(exposition, "faithproxy_policy_requests_total", policy="default", outcome="refused") == 2
    assert metric(exposition, "faithproxy_policy_requests_total", policy="ops", outcome="admitted") == 2
    assert MOBILE_KEY not in exposition and "FP_TEST_MOBILE_KEY" not in exposition


def _rewrite_and_hup(path: Path, text: str) -> None:
    path.write_text(text)
    os.kill(os.getpid(), signal.SIGHUP)


async def _reload(path: Path, text: str) -> None:
    _rewrite_and_hup(path, text)
    await asyncio.sleep(0.05)  # the loop runs the handler


async def test_reload_and_broken_reload(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    upstream = FakeUpstream(Sentences([f"Sentence number {i} of a long answer. " for i in range(200)]))
    path = tmp_path / "policy.yaml"
    async with proxy(tmp_path, POLICY, upstream) as url, httpx.AsyncClient(timeout=10) as http:

        async def ask(key: str, **headers: str) -> int:
            response = await http.post(f"{url}/v1/chat/completions", json=BODY, headers={**bearer(key), **headers})
            return response.status_code

        assert await ask(LATE_KEY) == 401
        assert await ask(OPS_KEY, **{"x-faithproxy-mode": "detect"}) == 200
        request = {**BODY, "stream": True}
        async with http.stream("POST", f"{url}/v1/chat/completions", json=request, headers=bearer(OPS_KEY)) as stream:
            chunks = stream.aiter_text()
            first = await anext(chunks)
            # the stream's key now may use no mode at all: the stream in flight goes on to its end
            reloaded = POLICY.replace(f'key: "{OPS_KEY}"', f'key: "{OPS_KEY}"\n    modes: [off]')
            await _reload(path, reloaded + f'  - name: late\n    key: "{LATE_KEY}"\n')
            rest = "".join([chunk async for chunk in chunks])
        assert stream.status_code == 200 and frames(first + rest)[-1] == "[DONE]"
        assert await ask(LATE_KEY) == 200
        assert await ask(OPS_KEY, **{"x-faithproxy-mode": "detect"}) == 403

        caplog.set_level(logging.ERROR, logger="faithproxy.server.admission.key_policy")
        await _reload(path, "default: {modes: [correct\nkeys: [")  # not YAML
        await _reload(path, "default: {modes: [sometimes]}\n")  # not a policy
        assert await ask(LATE_KEY) == 200  # the policies in force were kept
        assert await ask(OPS_KEY, **{"x-faithproxy-mode": "detect"}) == 403
        exposition = (await http.get(f"{url}/metrics")).text
    assert metric(exposition, "faithproxy_policy_reloads_total", result="failed") == 2
    assert metric(exposition, "faithproxy_policy_reloads_total", result="ok") == 1
    failures = [r.getMessage() for r in caplog.records if "policy reload failed" in r.getMessage()]
    assert len(failures) == 2 and "sometimes" in failures[1]
    assert all(OPS_KEY not in message and LATE_KEY not in message for message in failures)


async def test_broken_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("keys:\n  - name: a\n    key_env: FP_TEST_UNSET_VARIABLE\n")
    with pytest.raises(PolicyFileError, match="FP_TEST_UNSET_VARIABLE"):
        create_app(Settings(upstream_url="http://vllm.test", policy_file=str(path)))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("keys:\n  - name: a\n", "exactly one of key and key_env"),
        ('keys:\n  - {name: a, key: "k1"}\n  - {name: a, key: "k2"}\n', "unique"),
        ('keys:\n  - {name: a, key: "k1"}\n  - {name: b, key: "k1"}\n', "same key"),
        ('default: {key: "k"}\n', "the default policy has no key"),
        ("default: {retries: {min: 3, max: 1}}\n", "exceeds max"),
        ("default: {colour: blue}\n", "colour"),
    ],
)
def test_load_refuses(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyFileError, match=message):
        load_book(str(path))


def _policy(headers: dict[str, str], **settings: Any) -> Any:
    base = Settings(upstream_url="http://x", default_detector="judge", **settings)
    return policy_from_headers(headers, base, detectors=["none", "judge"], judges=["j1", "j2"])


def test_judge_and_budget_checks() -> None:
    limits = KeyPolicy(name="k", judges=["j1"], max_judge_budget=500)
    with pytest.raises(PolicyForbidden, match="x-faithproxy-judge.*Allowed: j1"):
        within(limits, {"x-faithproxy-judge": "j2"}, _policy({"x-faithproxy-judge": "j2"}))
    with pytest.raises(PolicyForbidden, match="absent and the server's default is 'j2'"):
        within(limits, {}, _policy({}, default_judge="j2"))
    # the judge is not used by detector none, unless named
    assert within(
        limits, {"x-faithproxy-detector": "none"}, _policy({"x-faithproxy-detector": "none"}, default_judge="j2")
    )
    # no budget asked: the policy's ceiling is the request's budget; a lower one is kept
    assert within(limits, {}, _policy({})).options["judge_budget_tokens"] == 500
    assert within(limits, {}, _policy({}, judge_budget_tokens=10_000)).options["judge_budget_tokens"] == 500
    asked = {"x-faithproxy-judge-budget": "7"}
    assert within(limits, asked, _policy(asked)).options["judge_budget_tokens"] == 7
