"""Every 500 is a bug with a test (issue 33).

Odd inputs found by probing every door in every mode (headers, framing, encodings, bodies), each a
500 before its fix: here as a 4xx in the door's error format with nothing sent upstream. And the last
line for the bugs not found yet: an exception that nothing answered is a 500 in the door's format
(Anthropic's on /v1/messages), logged with the request id and counted in
faithproxy_internal_errors_total (server/runtime/internal_errors.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from faithproxy.server.admission.connections import HTTP_PROTOCOL
from faithproxy.server.app import create_app
from faithproxy.server.doors.table import DOORS as TABLE
from faithproxy.server.runtime.internal_errors import InternalErrorMiddleware
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, metric, running_app

HI = [{"role": "user", "content": "hi"}]
DOORS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "m", "messages": HI, "max_tokens": 16},
    "/v1/completions": {"model": "m", "prompt": "hi", "max_tokens": 16},
    "/v1/responses": {"model": "m", "input": "hi", "max_output_tokens": 16},
    "/v1/messages": {"model": "m", "messages": HI, "max_tokens": 16},
}
ANTHROPIC = "/v1/messages"


def mode_headers(mode: str) -> dict[str, str]:
    return {"x-faithproxy-mode": mode, "x-faithproxy-detector": "none", "content-type": "application/json"}


def error_of(path: str, response: httpx.Response) -> dict[str, Any]:
    """The error object, checked to be in the door's format: Anthropic's on /v1/messages, else OpenAI's."""
    body = response.json()
    if path == ANTHROPIC:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def upstream_calls(vllm: FakeUpstream) -> int:
    return sum(1 for r in vllm.requests if r.method == "POST")


# ---- lone surrogates: every later encoding of the string raised UnicodeEncodeError ------------------


def _with(path: str, raw_field: bytes) -> bytes:
    """The door's body with one more field, spliced in as raw bytes (json.dumps cannot write them)."""
    return json.dumps(DOORS[path]).encode()[:-1] + b"," + raw_field + b"}"


LONE = {
    # found by probing: the report (non-streamed detect/correct) and the first SSE frame (streamed)
    # encode the model name and the text; both raised UnicodeEncodeError, a plain-text 500
    "escaped_in_a_value": b'"user":"a\\ud800b"',
    "escaped_low_half": b'"metadata":{"k":"\\udfff"}',
    "escaped_in_a_key": b'"\\udc00":1',
    "raw_cesu_bytes": b'"user":"\xed\xa0\x80"',  # json reads bytes with surrogatepass: the same string
}


@pytest.mark.parametrize("mode", ["off", "detect", "correct"])
async def test_lone_surrogates_are_400_invalid_unicode_at_every_door(mode: str) -> None:
    vllm = FakeUpstream()
    app = create_app(Settings(upstream_url="http://vllm.test"), upstream_transport=vllm.transport())
    async with running_app(app, http=HTTP_PROTOCOL) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        before = upstream_calls(vllm)
        for path in DOORS:
            for name, field in LONE.items():
                for stream in (b"false", b"true"):
                    raw = _with(path, field + b',"stream":' + stream)
                    response = await http.post(path, content=raw, headers=mode_headers(mode))
                    assert response.status_code == 400, (path, name, response.text[:300])
                    error = error_of(path, response)
                    if path == ANTHROPIC:
                        assert error["type"] == "invalid_request_error" and "surrogate" in error["message"]
                    else:
                        assert error["code"] == "invalid_unicode", (path, name, error)
        assert upstream_calls(vllm) == before  # nothing refused went upstream
        # a pair, escaped or raw, is a character like any other
        for path in DOORS:
            paired = _with(path, b'"user":"\\ud83d\\ude42 \xf0\x9f\x99\x82 \xed\x9f\xbf"')  # U+D7FF is no surrogate
            response = await http.post(path, content=paired, headers=mode_headers(mode))
            assert response.status_code != 400, (path, response.text[:300])


# ---- the last line: an exception nothing answered --------------------------------------------------


class _Bug(httpx.AsyncBaseTransport):
    """Under the vLLM client: the generation call raises an exception that is no httpx error (a bug in
    a layer below, as the proxy would meet it), before the answer or after its first bytes."""

    def __init__(self, after_first_bytes: bool = False) -> None:
        self.inner = FakeUpstream().transport()
        self.after_first_bytes = after_first_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST":
            return await self.inner.handle_async_request(request)
        if not self.after_first_bytes:
            raise RuntimeError("a bug below the proxy")
        response = await self.inner.handle_async_request(request)
        response.stream = _Broken(response.stream)  # type: ignore[arg-type]
        return response


class _Broken(httpx.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self.stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            yield chunk
            raise RuntimeError("a bug below the proxy, mid-answer")

    async def aclose(self) -> None:
        await self.stream.aclose()


def _logged(caplog: pytest.LogCaptureFixture, request_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if request_id in r.getMessage() and r.exc_info is not None]


async def test_an_unexpected_exception_is_a_500_in_the_doors_format_logged_with_the_request_id_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # off mode: its pass-through leaves exceptions that are no upstream error to the app (the other
    # modes turn them into an error of their own), so they reach the middleware
    app = create_app(Settings(upstream_url="http://vllm.test"), upstream_transport=_Bug())
    caplog.set_level(logging.ERROR, logger="faithproxy")
    async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        for path, body in DOORS.items():
            for stream in (False, True):
                response = await http.post(path, json=body | {"stream": stream}, headers=mode_headers("off"))
                assert response.status_code == 500, (path, response.text[:300])
                assert response.headers["content-type"] == "application/json"
                error = error_of(path, response)
                assert error["type"] == ("api_error" if path == ANTHROPIC else "server_error")
                if path != ANTHROPIC:
                    assert error["code"] == "internal_error"
                request_id = response.headers["x-faithproxy-request-id"]
                assert request_id in error["message"] and len(request_id) == 24  # admission's id
                (record,) = _logged(caplog, request_id)
                assert record.exc_info and "a bug below the proxy" in str(record.exc_info[1])
                assert path in record.getMessage()
        exposition = (await http.get("/metrics")).text
    for path in DOORS:
        assert metric(exposition, "faithproxy_internal_errors_total", door=path) == 2
    assert 'faithproxy_internal_errors_total{door="other"} 0.0' in exposition  # pre-initialised, none


async def test_an_exception_after_the_answer_started_breaks_the_connection_and_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = create_app(Settings(upstream_url="http://vllm.test"), upstream_transport=_Bug(after_first_bytes=True))
    caplog.set_level(logging.ERROR, logger="faithproxy")
    body = DOORS["/v1/chat/completions"] | {"stream": True}
    async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=mode_headers("off")) as response:
            assert response.status_code == 200  # sent before the failure: it cannot change
            request_id = response.headers["x-faithproxy-request-id"]
            with pytest.raises(httpx.RemoteProtocolError):  # not a stream that looks finished
                await response.aread()
        exposition = (await http.get("/metrics")).text
    assert metric(exposition, "faithproxy_internal_errors_total", door="/v1/chat/completions") == 1
    (record,) = _logged(caplog, request_id)
    assert "after the response started" in record.getMessage()


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions", "/metrics"])
async def test_a_failure_before_admission_gets_an_id_of_its_own(path: str, caplog: pytest.LogCaptureFixture) -> None:
    """The middleware alone around an app that fails before any door admitted the request (no state,
    so nothing to count): still the door's format and an id in the answer and the log."""

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise KeyError("a bug in front of the doors")

    caplog.set_level(logging.ERROR, logger="faithproxy")
    transport = httpx.ASGITransport(app=InternalErrorMiddleware(failing, doors=TABLE))
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
        response = await http.post(path, json={})
    assert response.status_code == 500
    error = error_of(path if path == ANTHROPIC else "/v1/chat/completions", response)
    request_id = response.headers["x-faithproxy-request-id"]
    assert request_id in error["message"] and _logged(caplog, request_id)


async def test_a_bug_below_the_reader_in_correct_mode_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """correct mode turns an exception that is no upstream error into the request's error (the machine
    decides what a failed round means); its traceback is logged, not lost."""
    app = create_app(Settings(upstream_url="http://vllm.test", default_detector="none"),
                     upstream_transport=_Bug(after_first_bytes=True))  # fmt: skip
    caplog.set_level(logging.ERROR, logger="faithproxy")
    body = DOORS["/v1/chat/completions"] | {"stream": True}
    async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        response = await http.post("/v1/chat/completions", json=body, headers=mode_headers("correct"))
    # the break came before the first verified step: nothing was sent yet, so it is the HTTP error
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "internal error while reading upstream: RuntimeError"
    (record,) = [r for r in caplog.records if r.getMessage() == "internal error while reading upstream"]
    assert record.exc_info and "a bug below the proxy, mid-answer" in str(record.exc_info[1])
