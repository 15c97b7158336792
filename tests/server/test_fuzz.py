"""Fuzzing: schemathesis against the proxy's own OpenAPI schema, and hypothesis on the parsers a
request or an upstream reply goes through.

The schemathesis run is bounded: a fixed number of generated cases, each sent in twelve variants (three
modes, annotated or not, streamed as generated or not): 10,800 requests, about a minute on the 2-core
machine. They go through the whole app in-process (the ASGI app called directly on one event loop: no
sockets, no network; generated image URLs are refused rather than fetched) with a MockTransport vLLM
that fails on purpose for some seeds. The property: no 5xx and no error frame except for the requests
whose upstream failure was injected (then only upstream errors), and every event stream ends with
`data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation import GenerationMode

from faithproxy import testing
from faithproxy.clients.vllm import _parse_chunk
from faithproxy.faithcore.correction import Rules, new_machine
from faithproxy.faithcore.correction.wire import ChatChunkReader
from faithproxy.faithcore.errors import FaithproxyError, PolicyError, UpstreamError
from faithproxy.server.admission.limits import check_body
from faithproxy.server.admission.policy import RequestPolicy, policy_from_headers
from faithproxy.server.app import create_app
from faithproxy.server.doors.chat import parse_chat_body
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, error_body, frames

INJECTED = "injected upstream failure"


class FlakyVLLM(FakeUpstream):
    """Healthy, except for bodies whose integer `seed` asks for a failure: seed % 7 == 3 is an HTTP 500,
    seed % 7 == 5 a stream cut off mid-way (a deliberate upstream error, allowed to surface as 5xx).
    Non-streamed calls are the prompt detector's self-checks: it answers like a self-checker."""

    def __init__(self) -> None:
        super().__init__(Sentences(reply_text="FAITHFUL"))

    def chat(self, body: dict[str, Any]) -> testing.Answer:
        seed, stream = body.get("seed"), body.get("stream") is True
        if not isinstance(seed, int) or isinstance(seed, bool):
            seed = 0
        if seed % 7 == 3 or (seed % 7 == 5 and not stream):
            return testing.Answer.json(500, error_body(INJECTED, "InternalServerError"))
        if seed % 7 == 5:
            cut = Sentences(["The image shows a cat. ", "It sits"], finish=None)
            return FakeUpstream(cut, fault="truncated").chat(body)
        return super().chat(body)


APP = create_app(
    # refuse: a generated http(s) image URL is a 400, never a fetch: the fuzzing touches no network
    Settings(upstream_url="http://vllm.test", default_detector="none", max_tokens_cap=4096, image_urls="refuse"),
    upstream_transport=FlakyVLLM().transport(),
)
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
# Generated cases per mode; each is sent in len(VARIANTS) variants: 10,800 requests per run, in about a
# minute on the 2-core CI machine (generating a case costs more than sending it, so cases are reused).
CASES = {GenerationMode.POSITIVE: 600, GenerationMode.NEGATIVE: 300}
MIN_REQUESTS = 10_000
# Bounded and reproducible: a fixed seed, and no shrinking (a failure prints its reproduce_failure blob).
FUZZ_SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    print_blob=True,
    phases=[Phase.explicit, Phase.generate],
)


@dataclass
class Answer:
    """A response of the app, called in-process."""

    status_code: int
    headers: dict[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class InProcess:
    """Calls the ASGI app directly on one event loop kept for the whole run (lifespan entered once): no
    sockets, no HTTP client, about a millisecond a request instead of schemathesis's five."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self._lifespan = app.router.lifespan_context(app)
        self.loop.run_until_complete(self._lifespan.__aenter__())

    def close(self) -> None:
        self.loop.run_until_complete(self._lifespan.__aexit__(None, None, None))
        self.loop.close()

    def call(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        return self.loop.run_until_complete(self._call(method, path, headers, body))

    async def _call(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        raw_headers = [(b"host", b"testserver"), (b"content-length", str(len(body)).encode())]
        raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": raw_headers,
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        sent = False
        done = asyncio.Event()
        status, out_headers, parts = 500, {}, []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, out_headers
            if message["type"] == "http.response.start":
                status = message["status"]
                out_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in message.get("headers", [])}
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done.set()

        await self.app(scope, receive, send)
        done.set()
        return Answer(status, out_headers, b"".join(parts))


@pytest.fixture(scope="module")
def app_in_process() -> Iterator[InProcess]:
    driver = InProcess(APP)
    try:
        yield driver
    finally:
        driver.close()


def injected(body: Any) -> bool:
    """Whether FlakyVLLM fails this request on purpose."""
    seed = body.get("seed") if isinstance(body, dict) else None
    return isinstance(seed, int) and not isinstance(seed, bool) and seed % 7 in (3, 5)


def check(response: Any, failing: bool, seen: Counter[str]) -> None:
    """No 5xx and no error frame, except the upstream failures injected into this very request."""
    status = response.status_code
    seen[f"{status // 100}xx"] += 1
    if 400 <= status < 500:
        seen[f"param={response.json()['error'].get('param')}"] += 1
    if status >= 500:
        assert failing, f"{status}: {response.text[:500]}"
        error = response.json()["error"]
        assert error.get("type") == "upstream_error" or INJECTED in str(error.get("message")), error
        seen["injected_5xx"] += 1
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = frames(response.text)
        assert data and data[-1] == "[DONE]", response.text[-300:]
        for payload in data[:-1]:
            error = json.loads(payload).get("error")
            if error is not None:
                assert failing and error.get("type") == "upstream_error", payload
                seen["injected_error_frames"] += 1


MODES = [
    {},  # the server's default mode (correct, detector none)
    {"x-faithproxy-mode": "off"},
    {"x-faithproxy-mode": "detect", "x-faithproxy-detector": "none"},
]
VARIANTS = [
    (mode, annotate, flip)
    for mode in MODES
    for annotate in ({}, {"x-faithproxy-annotate": "false"})
    for flip in (False, True)
]


def variants(kwargs: dict[str, Any]) -> Iterator[tuple[dict[str, str], bytes, Any]]:
    """One generated request as (headers, body bytes, body) in every mode, annotated or not, streamed as
    generated and the other way round (a body that is no JSON object stays as it is)."""
    base = {k: v for k, v in dict(kwargs.get("headers") or {}).items() if k.lower() != "content-length"}
    if "json" in kwargs:
        body = kwargs["json"]
        content = json.dumps(body).encode()
    else:
        body, content = None, kwargs.get("data") or b""
        content = content.encode() if isinstance(content, str) else content
    for mode, annotate, flip in VARIANTS:
        headers = {**base, **mode, **annotate}
        if flip and isinstance(body, dict):
            flipped = {**body, "stream": body.get("stream") is not True}
            yield headers, json.dumps(flipped).encode(), flipped
        else:
            yield headers, content, body


def fuzz_cases(
    operation: Any, mode: GenerationMode, examples: int, each: Callable[[dict[str, Any], Counter[str]], None]
) -> Counter[str]:
    """`examples` schemathesis cases of `operation`, each handed to `each` as transport kwargs with the
    tally it adds to; the tally (with "cases") comes back."""
    seen: Counter[str] = Counter()

    @given(case=operation.as_strategy(mode))
    @settings(FUZZ_SETTINGS, max_examples=examples)
    def run(case: Any) -> None:
        seen["cases"] += 1
        each(case.as_transport_kwargs(), seen)

    run()
    return seen


@pytest.mark.parametrize("mode", list(CASES), ids=lambda m: m.value)
def test_schemathesis_chat_completions(mode: GenerationMode, app_in_process: InProcess) -> None:
    operation = SCHEMA["/v1/chat/completions"]["POST"]

    def each(kwargs: dict[str, Any], seen: Counter[str]) -> None:
        for headers, content, body in variants(kwargs):
            answer = app_in_process.call(kwargs["method"], kwargs["url"], headers, content)
            check(answer, injected(body), seen)
            seen["requests"] += 1

    seen = fuzz_cases(operation, mode, CASES[mode], each)
    print(f"schemathesis {mode.value}: {dict(seen)}")
    assert seen["requests"] == len(VARIANTS) * seen["cases"] >= len(VARIANTS) * CASES[mode] * 0.9
    if mode is GenerationMode.POSITIVE:
        assert seen["2xx"] > seen["requests"] // 10  # the grammar does reach the upstream


def test_a_run_sends_at_least_ten_thousand_requests() -> None:
    assert len(VARIANTS) * sum(CASES.values()) >= MIN_REQUESTS


def test_the_in_process_driver_answers_like_the_http_server(app_in_process: InProcess) -> None:
    """The driver the fuzzing uses gives what a client over HTTP gets (same status, type and bytes)."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    answer = app_in_process.call("POST", "/v1/chat/completions", {"x-faithproxy-mode": "off"}, body)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    assert frames(answer.text)[-1] == "[DONE]" and answer.headers["x-faithproxy-mode"] == "off"
    bad = app_in_process.call("POST", "/v1/chat/completions", {}, b"{nope")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize(
    "body",
    [
        # found by hypothesis: a text part whose text is not a string crashed last_user_text (a 500)
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]},
        # found by schemathesis: JSON Schema integers may be written 256.0
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 256.0},
        # OpenAI accepts "stream": null
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": None},
        # found by schemathesis: a part whose "type" is a list crashed the media-URL scan (a 500)
        {"model": "m", "messages": [{"role": "user", "content": [{"type": ["image_url"]}, "hi"]}]},
    ],
)
def test_regressions(body: dict[str, Any]) -> None:
    operation = SCHEMA["/v1/chat/completions"]["POST"]
    response = operation.Case(body=body, headers={}).call()
    assert response.status_code == 200, response.text


_HI = b'"model":"m","messages":[{"role":"user","content":"hi"}]'
# Hostile bodies (issue 33): each was a 500 (RecursionError, ValueError) or reached vLLM; now a 400.
MALFORMED = [
    b"[" * 100_000 + b"]" * 100_000,
    b"{" + _HI + b',"tools":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b"[{" * 50_000,
    b"{" + _HI + b',"max_tokens":' + b"9" * 5000 + b"}",
    b"{" + _HI + b',"seed":-' + b"9" * 30 + b"}",
    b"{" + _HI + b',"max_tokens":1e300}',
    b"{" + _HI + b',"max_completion_tokens":99999999999}',
    b"{" + _HI + b',"temperature":NaN}',
    b"{" + _HI + b',"top_p":Infinity}',
    b"{" + _HI + b',"temperature":1e999}',  # inf to Python: re-encoded it would be "Infinity", not JSON
    # lone surrogates: every encoding of the string (report, SSE frame) raised UnicodeEncodeError
    b"{" + _HI + b',"user":"\\ud800"}',
    b'{"model":"\\udfff","messages":[{"role":"user","content":"hi"}]}',
    b'{"model":"m","messages":[{"role":"user","content":"\xed\xa0\x80"}]}',
]


@pytest.mark.parametrize("raw", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_bodies_are_400_in_every_variant(raw: bytes, app_in_process: InProcess) -> None:
    for headers, content, _ in variants({"data": raw, "headers": {"content-type": "application/json"}}):
        answer = app_in_process.call("POST", "/v1/chat/completions", headers, content)
        assert answer.status_code == 400, answer.text[:300]
        assert answer.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/models", "/healthz", "/readyz", "/metrics", "/openapi.json"])
def test_schemathesis_other_operations(path: str) -> None:
    if path == "/openapi.json":
        assert SCHEMA.raw_schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]["required"]
        return
    operation = SCHEMA[path]["GET"]

    @given(case=operation.as_strategy(GenerationMode.POSITIVE))
    @settings(FUZZ_SETTINGS, max_examples=20)
    def run(case: Any) -> None:
        assert case.call().status_code == 200

    run()


# ---- hypothesis on the parsers ------------------------------------------------------------------


def _nest(inner: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return inner | st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)


# JSON values nested three deep, built level by level: hypothesis 6.170 warns (an error under
# filterwarnings=error) when st.recursive's extend draws no child in a run, which a generated value may.
_SCALAR = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
JSON = _nest(_nest(_nest(_SCALAR)))
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio"]) | st.text(max_size=5)},
    optional={"text": JSON, "image_url": JSON | st.fixed_dictionaries({"url": JSON})},
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"]) | JSON},
    optional={"content": JSON | st.lists(PART | JSON, max_size=4)},
)
BODY = st.fixed_dictionaries(
    {"model": JSON | st.just("m"), "messages": JSON | st.lists(MESSAGE | JSON, max_size=4)},
    optional={
        "stream": JSON,
        "max_tokens": JSON,
        "max_completion_tokens": JSON,
        "n": JSON,
        "stream_options": JSON,
    },
)


@given(raw=st.binary(max_size=200) | BODY.map(lambda b: json.dumps(b).encode()))
def test_parse_body_raises_only_policy_errors(raw: bytes) -> None:
    try:
        body = parse_chat_body(raw)
    except PolicyError:
        return
    assert isinstance(body["model"], str) and body["messages"]
    try:
        check_body(body, Settings(max_tokens_cap=100))
    except PolicyError:
        return


HEADER_NAMES = st.sampled_from(
    [
        "x-faithproxy-mode",
        "x-faithproxy-detector",
        "x-faithproxy-max-retries",
        "x-faithproxy-judge",
        "x-faithproxy-on-detector-error",
        "x-faithproxy-annotate",
    ]
)


@given(headers=st.dictionaries(HEADER_NAMES, st.text(max_size=12)))
def test_policy_from_any_headers_is_a_policy_or_a_policy_error(headers: dict[str, str]) -> None:
    try:
        policy = policy_from_headers(headers, Settings(), detectors=["judge", "none"], judges=["a"])
    except PolicyError as exc:
        assert exc.param in headers or exc.param == "x-faithproxy-detector"
        return
    assert isinstance(policy, RequestPolicy) and 0 <= policy.max_retries <= 10


CHUNK = st.fixed_dictionaries(
    {},
    optional={
        "choices": JSON
        | st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "index": JSON,
                    "delta": JSON | st.dictionaries(st.sampled_from(["content", "reasoning", "tool_calls"]), JSON),
                    "finish_reason": JSON,
                },
            )
            | JSON,
            max_size=3,
        ),
        "usage": JSON,
        "error": JSON,
        "id": JSON,
    },
)


@given(payload=st.text(max_size=50) | JSON.map(json.dumps) | CHUNK.map(json.dumps))
def test_upstream_chunks_parse_or_raise_upstream_error(payload: str) -> None:
    """Whatever vLLM streams, the machine gets well-formed events or the driver an UpstreamError, never a crash
    (a crash would reach the client as an internal-error frame)."""
    wire, core = ChatChunkReader(), new_machine(Rules("detect", "d"))
    try:
        for event in wire.events(_parse_chunk(payload)):
            core.receive(event)  # the machine takes whatever the wire reader made of it
        core.receive(wire.end())  # and adds up the round's usage
    except UpstreamError:
        return
    except FaithproxyError as exc:  # pragma: no cover - reported with its type
        raise AssertionError(f"unexpected {type(exc).__name__}") from exc
