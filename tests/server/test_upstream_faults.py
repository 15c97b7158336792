"""Upstream faults injected under the vLLM client (httpx.MockTransport): every stream ends
well-formed, every request is traced and counted. Real-vLLM behaviour is in tests/integration."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, Sentences, delta, frames, running_app, sse

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}], "stream": True}
HEADERS = {"x-faithproxy-detector": "none"}
# A MockTransport handler: a plain function, or FakeUpstream.handle
Handler = Callable[[httpx.Request], httpx.Response] | Callable[[httpx.Request], Awaitable[httpx.Response]]


@contextlib.asynccontextmanager
async def serve(handler: Handler, tmp_path: Path, **settings: object) -> AsyncIterator[tuple[str, Path]]:
    trace = tmp_path / "t.jsonl"
    app = create_app(
        Settings(upstream_url="http://vllm.test", trace_path=str(trace), **settings),
        upstream_transport=httpx.MockTransport(handler),
    )
    async with running_app(app) as url:
        yield url, trace


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path


async def run(
    handler: Handler, tmp: Path, body: dict | None = None, headers: dict | None = None, **settings: object
) -> tuple[httpx.Response, list[dict], str]:
    async with serve(handler, tmp, **settings) as (url, trace):
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.post(f"{url}/v1/chat/completions", json=body or BODY, headers=headers or HEADERS)
            metrics = (await http.get(f"{url}/metrics")).text
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return response, records, metrics


async def test_stream_cut_mid_way_ends_with_error_frame_and_done(tmp: Path) -> None:
    # without resume attempts (FAITHPROXY_UPSTREAM_RESUME_ATTEMPTS=0): the break is the request's end;
    # with them, tests/server/test_resume.py
    cut = Sentences(["The image shows a cat. ", "It is black. It sits"], finish=None)
    response, records, metrics = await run(FakeUpstream(cut, fault="truncated").handle, tmp, upstream_resume_attempts=0)
    data = frames(response.text)
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["type"] == "upstream_error" and error["code"] == "stream_truncated"
    sent = "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in data[:-2])
    assert sent == "The image shows a cat. It is black."  # whole steps only, nothing half-sent
    assert records[0]["error"]["code"] == "stream_truncated" and len(records[0]["steps"]) == 2
    assert 'faithproxy_upstream_errors_total{reason="stream_truncated"} 1.0' in metrics


async def test_malformed_json_in_stream(tmp: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            content=sse(delta("One. Two. ")).replace(b"[DONE]", b"{not json"),
            headers={"content-type": "text/event-stream"},
        )

    response, records, metrics = await run(handler, tmp)
    data = frames(response.text)
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "malformed"
    assert 'faithproxy_upstream_errors_total{reason="malformed"} 1.0' in metrics
    assert len(records) == 1


async def test_upstream_http_error_before_first_byte_is_passed_on(tmp: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            404,
            json={
                "error": {
                    "message": "The model `m` does not exist.",
                    "type": "NotFoundError",
                    "param": None,
                    "code": 404,
                }
            },
        )

    response, records, _ = await run(handler, tmp)
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "The model `m` does not exist."
    assert records[0]["error"]["message"] == "The model `m` does not exist."


async def test_upstream_refusing_connections_is_502(tmp: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    response, records, metrics = await run(handler, tmp)
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"
    assert 'faithproxy_upstream_errors_total{reason="connect"} 1.0' in metrics
    assert len(records) == 1


async def test_unknown_fields_are_forwarded_untouched(tmp: Path) -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=sse(delta("Done.", "stop")), headers={"content-type": "text/event-stream"})

    body = {**BODY, "top_k": 7, "vendor_field": {"nested": [1, 2]}, "stream": False}
    response, _, _ = await run(handler, tmp, body=body)
    assert response.status_code == 200
    assert seen[0]["top_k"] == 7 and seen[0]["vendor_field"] == {"nested": [1, 2]}
    assert response.json()["choices"][0]["message"]["content"] == "Done."


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        (b"{not json", HEADERS, None),
        (json.dumps({"model": "m", "messages": []}).encode(), HEADERS, "messages"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), HEADERS, "model"),
        (json.dumps(BODY).encode(), {"x-faithproxy-mode": "bogus"}, "x-faithproxy-mode"),
        (
            json.dumps(
                {
                    **BODY,
                    "messages": [
                        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}
                    ],
                }
            ).encode(),
            HEADERS,
            "messages",
        ),
    ],
)
async def test_bad_input_is_400_and_nothing_goes_upstream(
    body: bytes, headers: dict, param: str | None, tmp: Path
) -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(500)

    async with serve(handler, tmp) as (url, _):
        async with httpx.AsyncClient() as http:
            response = await http.post(
                f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json", **headers}
            )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert [c for c in calls if c.url.path == "/v1/chat/completions"] == []
