"""One routing key per request on every upstream call (server/admission/affinity.py, clients/vllm.py
ROUTING_KEY).

A corrected request against a fake vLLM (a chain with a planted unfaithful sentence) and a local judge:
its first round, its rewrite (a non-streamed call) and its continuation all carry the
same key; the next request another; a key the client sent is kept; the header's name is a setting, and
an empty name sends none.
"""

from __future__ import annotations

import contextlib
from typing import Any

import httpx
import pytest

from faithproxy.testing import FakeUpstream
from tests.support import planted_chain_proxy

N, SEED, PLANTED = 6, 1, 2
BODY = {
    "model": "chain-model",
    "messages": [{"role": "user", "content": f"chain n={N} seed={SEED} planted={PLANTED}"}],
    "stream": True,
}


def proxy(**settings: Any) -> contextlib.AbstractAsyncContextManager[tuple[str, FakeUpstream]]:
    return planted_chain_proxy(N, SEED, PLANTED, **settings)


async def corrected(url: str, headers: dict[str, str] | None = None) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{url}/v1/chat/completions", json=BODY, headers=headers or {})
    assert response.status_code == 200 and '"regenerated":true' in response.text.replace(" ", "")  # a rewrite happened


def calls(vllm: FakeUpstream) -> list[httpx.Request]:
    return [r for r in vllm.requests if r.url.path == "/v1/chat/completions"]


async def test_every_call_of_a_request_carries_one_key_and_the_next_request_another() -> None:
    async with proxy() as (url, vllm):
        await corrected(url)
        first = calls(vllm)
        await corrected(url)
        second = calls(vllm)[len(first) :]
    # first round (stream), the rewrite (not streamed), the continuation (stream)
    assert [b'"stream": true' in r.content or b'"stream":true' in r.content for r in first] == [True, False, True]
    (key,) = {r.headers.get("x-session-id") for r in first}
    (other,) = {r.headers.get("x-session-id") for r in second}
    assert key and other and key != other


async def test_a_key_the_client_sent_is_kept() -> None:
    async with proxy() as (url, vllm):
        await corrected(url, {"X-Session-ID": "conversation-42"})
    assert {r.headers.get("x-session-id") for r in calls(vllm)} == {"conversation-42"}


@pytest.mark.parametrize(("header", "sent"), [("x-user-id", "x-user-id"), ("", None)])
async def test_the_header_is_a_setting_and_an_empty_one_sends_none(header: str, sent: str | None) -> None:
    async with proxy(routing_header=header) as (url, vllm):
        await corrected(url)
    requests = calls(vllm)
    assert len(requests) == 3 and all("x-session-id" not in r.headers for r in requests)
    if sent is None:
        assert all("x-user-id" not in r.headers for r in requests)
    else:
        assert len({r.headers.get(sent) for r in requests}) == 1 and requests[0].headers.get(sent)
