"""Per-client limits (issue 33): one client over its limit of requests in flight (per API key, else per
address) or of open connections (per address) gets 429 with Retry-After, while another client's
requests all succeed. Against the real server with server/admission/connections.py's protocol."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from faithproxy.server.admission.connections import HTTP_PROTOCOL
from faithproxy.server.admission.limits import client_key
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import running_app
from faithproxy.testing.metrics import metric
from tests.server.test_limits import HeldVLLM, body

CHAT = "/v1/chat/completions"
NO_DETECTOR = {"x-faithproxy-detector": "none"}


@contextlib.asynccontextmanager
async def proxy(vllm: Any, **overrides: Any) -> AsyncIterator[str]:
    settings = Settings(upstream_url="http://vllm.test", retry_after_s=2, **overrides)
    app = create_app(settings, upstream_transport=vllm.transport())
    async with running_app(app, http=HTTP_PROTOCOL) as url:
        yield url


def client_from(url: str, address: str, key: str | None = None) -> httpx.AsyncClient:
    """A client whose connections come from `address` (any 127.x.y.z is the loopback on Linux)."""
    headers = {**NO_DETECTOR, **({"authorization": f"Bearer {key}"} if key else {})}
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=url, transport=transport, headers=headers, timeout=30, trust_env=False)


async def until(condition: Any, limit_s: float = 10) -> None:
    for _ in range(int(limit_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("condition not met")


async def test_a_key_over_its_requests_in_flight_gets_429_while_another_key_is_served() -> None:
    vllm = HeldVLLM()
    async with (
        proxy(vllm, api_keys="key-a,key-b", max_requests_per_client=2) as url,
        client_from(url, "127.0.0.1", "key-a") as a,
        client_from(url, "127.0.0.1", "key-b") as b,  # the same address: the key decides
    ):
        held_a = [asyncio.create_task(a.post(CHAT, json=body(stream=True))) for _ in range(2)]
        await until(lambda: vllm.open == 2)
        refused = await a.post(CHAT, json=body())
        served_b = [asyncio.create_task(b.post(CHAT, json=body(stream=True))) for _ in range(2)]
        await until(lambda: vllm.open == 4)  # both of b's are in flight beside a's two
        vllm.release.set()
        done = await asyncio.gather(*held_a, *served_b)
        after = await a.post(CHAT, json=body())  # a's slots came back
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "too_many_client_requests"
    assert [r.status_code for r in done] == [200] * 4
    assert after.status_code == 200


async def test_without_a_key_the_address_is_the_client() -> None:
    vllm = HeldVLLM()
    async with (
        proxy(vllm, max_requests_per_client=1) as url,
        client_from(url, "127.0.0.1") as one,
        client_from(url, "127.0.0.2") as other,
    ):
        held = asyncio.create_task(one.post(CHAT, json=body(stream=True)))
        await until(lambda: vllm.open == 1)
        refused = await one.post(CHAT, json=body())
        served = asyncio.create_task(other.post(CHAT, json=body(stream=True)))
        await until(lambda: vllm.open == 2)
        vllm.release.set()
        done = await asyncio.gather(held, served)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_client_requests"
    assert [r.status_code for r in done] == [200, 200]


async def test_an_address_over_its_connections_gets_429_while_another_is_served() -> None:
    vllm = HeldVLLM()
    vllm.release.set()  # answers at once
    async with proxy(vllm, max_connections_per_client=3) as url, client_from(url, "127.0.0.2") as other:
        port = int(url.rsplit(":", 1)[1])
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        async with client_from(url, "127.0.0.1") as fourth:
            refused = await fourth.post(CHAT, json=body())
        served = [await other.post(CHAT, json=body()) for _ in range(3)]
        idle[0][1].close()  # one of the three goes: the address may connect again
        await idle[0][1].wait_closed()
        await asyncio.sleep(0.2)  # the server, on this event loop, sees the close
        async with client_from(url, "127.0.0.1") as again:
            retried = await again.post(CHAT, json=body())
        text = (await other.get("/metrics")).text
        for _, writer in idle[1:]:
            writer.close()
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    assert refused.json()["error"]["code"] == "too_many_connections"
    assert refused.headers.get("connection") == "close"
    assert [r.status_code for r in served] == [200] * 3
    assert retried.status_code == 200
    assert metric(text, "faithproxy_client_connections_closed_total", reason="too_many_connections") == 1


def test_the_client_is_the_key_digest_else_the_address() -> None:
    keyed = {"headers": [(b"authorization", b"Bearer secret")], "client": ("10.0.0.1", 5)}
    assert client_key(keyed).startswith("key:") and "secret" not in client_key(keyed)
    assert client_key({"headers": [], "client": ("10.0.0.1", 5)}) == "addr:10.0.0.1"
    assert client_key({"headers": []}) == "addr:-"
