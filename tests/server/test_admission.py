"""One admission path (server/admission/admit.py): the chat router and off mode's pure-ASGI middleware refuse
the same bad request with the same status and error, count it the same way, and send nothing upstream.
A real uvicorn proxy in front of a FakeUpstream."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from faithproxy.server.admission import admit as admission
from faithproxy.server.app import create_app
from faithproxy.server.doors import off as passthrough
from faithproxy.server.doors import routes as chat
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, metric, running_app

PNG = "data:image/png;base64,iVBORw0KGgo="


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def images(*urls: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return body(messages=[{"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}])


# (what is wrong, the body, extra headers, the status and error code both doors answer with)
REFUSALS = [
    ("not JSON", b"{not json", {}, 400, "invalid_json"),
    ("not an object", b"[1, 2]", {}, 400, "invalid_json"),
    ("no messages", body(messages=[]), {}, 400, None),
    ("no model", body(model=""), {}, 400, None),
    ("stream not a boolean", body(stream="yes"), {}, 400, None),
    ("too many images", images(PNG, PNG), {}, 400, "too_many_images"),
    ("max_tokens over the cap", body(max_tokens=100), {}, 400, "max_tokens_too_large"),
    ("a file URL", images("file:///etc/passwd"), {}, 400, "image_refused"),
    ("a bad header", body(), {"x-faithproxy-max-retries": "many"}, 400, "invalid_header"),
]


def spy(calls: list[str], door: str, admit: Callable[..., Any]) -> Callable[..., Any]:
    async def spied(*args: Any, **kwargs: Any) -> Any:
        calls.append(door)
        return await admit(*args, **kwargs)

    return spied


@pytest.mark.parametrize(("case", "payload", "headers", "status", "code"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_router_and_middleware_refuse_alike(
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    payload: bytes | dict[str, Any],
    headers: dict[str, str],
    status: int,
    code: str | None,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(chat, "admit", spy(calls, "router", admission.admit))
    monkeypatch.setattr(passthrough, "admit", spy(calls, "middleware", admission.admit))
    upstream = FakeUpstream()
    settings = Settings(
        upstream_url="http://vllm.test", default_detector="none", max_images_per_request=1, max_tokens_cap=10
    )
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    answers = {}
    async with running_app(create_app(settings, upstream_transport=upstream.transport())) as url:
        async with httpx.AsyncClient(timeout=10) as http:
            for mode in ("off", "detect", "correct"):
                answers[mode] = await http.post(
                    f"{url}/v1/chat/completions",
                    content=content,
                    headers={"content-type": "application/json", "x-faithproxy-mode": mode, **headers},
                )
            exposition = (await http.get(f"{url}/metrics")).text
    assert calls == ["middleware", "router", "router"]  # off mode never reached the router
    errors = {mode: (r.status_code, r.json()) for mode, r in answers.items()}
    assert errors["off"] == errors["detect"] == errors["correct"], case
    assert errors["off"][0] == status and errors["off"][1]["error"]["code"] == code
    assert [r for r in upstream.requests if r.url.path == "/v1/chat/completions"] == []
    assert metric(exposition, "faithproxy_requests_total", mode="rejected", status="4xx") == 3
    assert metric(exposition, "faithproxy_requests_total") == 3
