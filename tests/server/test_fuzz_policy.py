"""Fuzzing with a policy per API key (server/admission/key_policy.py): schemathesis against the chat door's OpenAPI
schema, on the in-process app and the flaky fake vLLM of tests/server/test_fuzz.py, with a policy file
whose keys limit modes, detectors, retries and hints. Each generated case (its X-Faithproxy-* headers
included) is sent with four keys, as generated and in mode off: 8 variants, 480 requests.

The property: the policy's refusals are in the fuzzed space (403s are seen) and are always a clean
403 `forbidden_by_policy` naming the header, with nothing sent upstream and no key in the message; the
unlimited key is never refused; and otherwise what test_fuzz.py asserts: no 5xx except the upstream
failures injected into that request, every event stream ending with `data: [DONE]`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis.generation import GenerationMode

from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from tests.server.test_fuzz import FlakyVLLM, InProcess, check, fuzz_cases, injected

API_KEY = "fp-fuzz-api-key-0001"  # FAITHPROXY_API_KEYS: the default policy
KEYS = {
    "default": API_KEY,
    "mobile": "fp-fuzz-mobile-key-0002",
    "strict": "fp-fuzz-strict-key-0003",
    "ops": "fp-fuzz-ops-key-0004",
}
POLICY = f"""
default: {{modes: [correct, detect], detectors: [none]}}
keys:
  - name: mobile
    key: "{KEYS["mobile"]}"
    modes: [correct]
    detectors: [none]
    retries: {{min: 1, max: 5}}
    hints: false
  - name: strict
    key: "{KEYS["strict"]}"
    modes: [correct, detect, "off"]
    retries: {{min: 4, max: 5}}
  - name: ops
    key: "{KEYS["ops"]}"
"""
CASES = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 20}
MODE_OVERRIDES: list[dict[str, str]] = [{}, {"x-faithproxy-mode": "off"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcess, FlakyVLLM, Any]]:
    path: Path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY)
    vllm = FlakyVLLM()
    app = create_app(
        Settings(
            upstream_url="http://vllm.test",
            default_detector="none",
            max_tokens_cap=4096,
            image_urls="refuse",
            api_keys=[API_KEY],
            policy_file=str(path),
        ),  # type: ignore[arg-type]
        upstream_transport=vllm.transport(),
    )
    driver = InProcess(app)
    try:
        # /openapi.json is behind the keys too; the schema is the app's own, read after its lifespan began
        yield driver, vllm, schemathesis.openapi.from_dict(app.openapi())
    finally:
        driver.close()


def _variants(kwargs: dict[str, Any]) -> Iterator[tuple[str, dict[str, str], bytes]]:
    base = {
        k: v
        for k, v in dict(kwargs.get("headers") or {}).items()
        if k.lower() not in ("content-length", "authorization")
    }
    content = kwargs.get("data") or b""
    if "json" in kwargs:
        content = json.dumps(kwargs["json"]).encode()
    content = content.encode() if isinstance(content, str) else content
    for name, key in KEYS.items():
        for override in MODE_OVERRIDES:
            yield name, {**base, **override, "authorization": f"Bearer {key}"}, content


def _check_refusal(answer: Any, name: str, upstream_calls: int, vllm: FlakyVLLM, seen: Counter[str]) -> None:
    error = answer.json()["error"]
    assert error["code"] == "forbidden_by_policy" and error["type"] == "invalid_request_error", error
    assert str(error.get("param", "")).lower().startswith("x-faithproxy-"), error
    assert name != "ops", f"the unlimited key was refused: {error}"
    assert not any(key in answer.text for key in KEYS.values())
    assert len(vllm.requests) == upstream_calls, "a refused request reached vLLM"
    seen[f"403 {name} {error['param'].lower()}"] += 1


@pytest.mark.parametrize("mode", list(CASES), ids=lambda m: m.value)
def test_schemathesis_with_a_policy_file(mode: GenerationMode, served: tuple[InProcess, FlakyVLLM, Any]) -> None:
    driver, vllm, schema = served
    operation = schema["/v1/chat/completions"]["POST"]

    def each(kwargs: dict[str, Any], seen: Counter[str]) -> None:
        body = kwargs.get("json")
        for name, headers, content in _variants(kwargs):
            upstream_calls = len(vllm.requests)
            answer = driver.call(kwargs["method"], kwargs["url"], headers, content)
            check(answer, injected(body), seen)
            assert answer.status_code != 401, answer.text
            if answer.status_code == 403:
                _check_refusal(answer, name, upstream_calls, vllm, seen)
            seen["requests"] += 1

    seen = fuzz_cases(operation, mode, CASES[mode], each)
    print(f"schemathesis with a policy, {mode.value}: {dict(seen)}")
    assert seen["requests"] == len(KEYS) * len(MODE_OVERRIDES) * seen["cases"] >= 8 * CASES[mode] * 0.9
    assert seen["4xx"] >= 1 and any(k.startswith("403 ") for k in seen)  # refusals are in the fuzzed space
    if mode is GenerationMode.POSITIVE:
        assert seen["2xx"] > seen["requests"] // 10  # and so are admitted requests
        refused_headers = {k.split()[-1] for k in seen if k.startswith("403 ")}
        assert {"x-faithproxy-mode", "x-faithproxy-max-retries"} <= refused_headers, dict(seen)
