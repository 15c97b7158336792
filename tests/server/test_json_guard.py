"""Malformed bodies (issue 33): deep nesting, huge integers and non-JSON constants are 400s in OpenAI's
error format in every mode, refused before the parser can recurse or allocate without bound."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.admission.json_guard import MAX_DEPTH, MAX_INT_DIGITS, check_depth, load_json
from faithproxy.server.admission.limits import MAX_TOKEN_COUNT, check_body
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, running_app

DEEP = b"[" * 100_000 + b"]" * 100_000
MESSAGES = b'"messages":[{"role":"user","content":"hi"}]'


def chat(extra: bytes) -> bytes:
    return b'{"model":"m",' + MESSAGES + b"," + extra + b"}"


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + close * depth


# ---- the guard alone ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        DEEP,
        b"[" * 100_000,  # never closed
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        b"[{" * 50_000 + b"}]" * 50_000,  # alternating kinds: one level per pass, never two
        b"[[]," * 10 + nested(MAX_DEPTH + 1) + b"]" * 10,  # wide before deep
        chat(b'"x":' + nested(MAX_DEPTH + 1)),
    ],
)
def test_nesting_beyond_the_limit_is_refused_without_recursion(raw: bytes) -> None:
    with pytest.raises(PolicyError) as caught:
        load_json(raw)
    assert caught.value.code == "nesting_too_deep" and caught.value.status_code == 400


@pytest.mark.parametrize(
    "raw",
    [
        nested(MAX_DEPTH),
        b"[" + b"[]," * 5000 + b"[]]",  # wide, shallow
        b'["' + b"[" * 1000 + b'"]',  # brackets in a string do not nest
        b'["\\"' + b"[" * 1000 + b'"]',  # nor after an escaped quote
        chat(b'"x":' + nested(MAX_DEPTH - 1)),
    ],
)
def test_nesting_within_the_limit_parses(raw: bytes) -> None:
    assert load_json(raw) == json.loads(raw)


def _nest(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return inner | st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)


# built level by level, as in test_fuzz.py (st.recursive may warn, an error here, when it draws no child)
@settings(deadline=None)  # timing is not the property: a loaded machine must not fail it
@given(_nest(_nest(_nest(_nest(st.integers(0, 9) | st.text(alphabet='[]{}\\"', max_size=4))))))
def test_the_depth_scan_agrees_with_the_parsed_depth(value: Any) -> None:
    def depth(v: Any) -> int:
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        return int(isinstance(v, (dict, list))) + max((depth(c) for c in children), default=0)

    for wrap in range(0, MAX_DEPTH + 2, 7):  # bring the value's deepest point around the limit
        raw = b"[" * wrap + json.dumps(value).encode() + b"]" * wrap
        if wrap + depth(value) > MAX_DEPTH:
            with pytest.raises(PolicyError):
                check_depth(raw)
        else:
            check_depth(raw)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (chat(b'"seed":' + b"9" * 5000), "number_too_large"),  # json alone: ValueError, a 500
        (chat(b'"seed":-' + b"1" * (MAX_INT_DIGITS + 1)), "number_too_large"),
        (chat(b'"temperature":1e999'), "number_too_large"),  # inf, re-encoded as "Infinity" (not JSON)
        (chat(b'"top_p":-' + b"9" * 400 + b".5"), "number_too_large"),
        (chat(b'"temperature":NaN'), "invalid_json"),
        (chat(b'"temperature":-Infinity'), "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
    ],
)
def test_huge_integers_and_constants_are_refused(raw: bytes, code: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_json(raw)
    assert caught.value.code == code


def test_long_digit_runs_in_strings_and_floats_are_fine() -> None:
    raw = chat(b'"x":"' + b"1" * 5000 + b'","y":1.' + b"0" * 100 + b',"seed":' + b"9" * MAX_INT_DIGITS)
    assert load_json(raw)["seed"] == int("9" * MAX_INT_DIGITS)
    small = load_json(chat(b'"a":1e-999,"b":1.5e300,"c":"1e999"'))
    assert (small["a"], small["b"], small["c"]) == (0.0, 1.5e300, "1e999")


@pytest.mark.parametrize("value", [MAX_TOKEN_COUNT + 1, 1e300, 10**19])
def test_token_counts_no_model_can_produce_are_400_without_a_cap(value: float) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": value}
    with pytest.raises(PolicyError) as caught:
        check_body(body, Settings())
    assert caught.value.code == "max_tokens_too_large"
    assert len(caught.value.message) < 120, caught.value.message  # 1e300 is not spelled out in 301 digits


# ---- through the server, every mode --------------------------------------------------------------

MALFORMED = {
    "deep": (DEEP, "nesting_too_deep"),
    "deep_in_a_message": (chat(b'"tools":' + nested(100_000)), "nesting_too_deep"),
    "huge_integer": (chat(b'"max_tokens":' + b"7" * 5000), "number_too_large"),
    "huge_max_tokens": (chat(b'"max_tokens":1' + b"0" * 15), "max_tokens_too_large"),
    "nan": (chat(b'"top_p":NaN'), "invalid_json"),
    "inf": (chat(b'"temperature":1e400'), "number_too_large"),
}


@pytest.mark.parametrize("mode", ["correct", "detect", "off"])
async def test_malformed_bodies_are_400_in_openai_format_in_every_mode(mode: str) -> None:
    vllm = FakeUpstream()
    app = create_app(Settings(upstream_url="http://vllm.test"), upstream_transport=vllm.transport())
    headers = {"x-faithproxy-mode": mode, "x-faithproxy-detector": "none", "content-type": "application/json"}
    async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=10, headers=headers) as http:
        for name, (raw, code) in MALFORMED.items():
            response = await http.post("/v1/chat/completions", content=raw)
            assert response.status_code == 400, (name, response.text[:300])
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and error["code"] == code, (name, error)
        ok = await http.post("/v1/chat/completions", content=chat(b'"max_tokens":16'))
    assert ok.status_code == 200
    chats = [r for r in vllm.requests if r.url.path == "/v1/chat/completions"]
    assert len(chats) == 1  # nothing malformed went upstream
