"""Refusals counted by reason (server/admission/refusals.py) and the cap on verification calls upstream
(clients/call_gate.py)."""

from __future__ import annotations

import asyncio

import httpx

from faithproxy.clients.call_gate import CallGate
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, metric, running_app

KEY = "fp-refusals-key-0123456789"
BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


async def test_refusals_are_counted_by_reason_and_door() -> None:
    settings = Settings(upstream_url="http://vllm.test", api_keys=[KEY], max_body_bytes=2048)  # type: ignore[list-item]
    app = create_app(settings, upstream_transport=FakeUpstream().transport())
    auth = {"authorization": f"Bearer {KEY}", "x-faithproxy-mode": "off"}
    async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        statuses = [
            (await http.post("/v1/chat/completions", json=BODY)).status_code,  # no key
            (await http.post("/v1/chat/completions", content=b"x" * 4096, headers=auth)).status_code,  # too large
            (await http.post("/v1/chat/completions", json={"model": "m"}, headers=auth)).status_code,  # no messages
            (await http.post("/v1/chat/completions", json=BODY, headers=auth)).status_code,  # served
        ]
        text = (await http.get("/metrics", headers=auth)).text
    assert statuses == [401, 413, 400, 200]
    door = "/v1/chat/completions"
    for reason in ("authentication", "limits", "policy"):
        assert metric(text, "faithproxy_refusals_total", reason=reason, endpoint=door) == 1, reason
    assert metric(text, "faithproxy_refusals_total", reason="timeouts") == 0


async def test_calls_beyond_the_cap_wait_and_are_counted() -> None:
    waits: list[str] = []
    inside = {"judge": 0}
    most = 0

    def on_slots(kind: str, change: int) -> None:
        nonlocal most
        inside[kind] += change
        most = max(most, inside[kind])

    gate = CallGate(1, on_wait=waits.append, on_slots=on_slots)
    release = asyncio.Event()

    async def call() -> str:
        await release.wait()
        return "done"

    first = asyncio.create_task(gate.call("judge", call))
    await asyncio.sleep(0)  # the first takes the slot
    second = asyncio.create_task(gate.call("judge", call))
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(first, second) == ["done", "done"]
    assert waits == ["judge"] and most == 1 and inside["judge"] == 0
