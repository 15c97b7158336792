"""Helpers shared by the tests that run the proxy against real vLLM and the local judge."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import Chain, FakeUpstream, planted_sentence, running_app, threaded_app


def local_judge_settings(vllm_url: str, judge_url: str, **overrides: Any) -> Settings:
    """Proxy settings with the local judge behind both wire protocols: `claude` (Anthropic Messages,
    the default) and `qwen` (OpenAI chat). Greedy regeneration: the fixture model is trained for it. The
    judges' limit is one no loaded machine reaches (vLLM on CPU beside it): a judge call that ran into it
    would leave its steps unchecked, and a test comparing verdicts would see "unknown"."""
    judges = [
        JudgeConfig(name="claude", backend="anthropic", model="judge", base_url=judge_url, api_key="k1",
                    timeout_s=30, max_retries=0),
        JudgeConfig(name="qwen", backend="openai", model="judge", base_url=f"{judge_url}/v1", api_key="k2",
                    timeout_s=30, max_retries=0, temperature=0.0),
    ]  # fmt: skip
    return Settings(
        upstream_url=vllm_url,
        judges=judges,
        default_judge="claude",
        regeneration_temperature=0.0,
        **overrides,
    )


async def proxy_metrics(proxy_url: str) -> str:
    """The proxy's /metrics page (Prometheus text)."""
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{proxy_url}/metrics")).text


def read_traces(path: Path) -> list[dict[str, Any]]:
    """Every trace record the proxy wrote to `path`, in order."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def local_judge_config(backend: str, url: str, **overrides: Any) -> JudgeConfig:
    """A judge on a local judge server at `url`, through either SDK (the OpenAI one wants /v1)."""
    values: dict[str, Any] = {
        "name": f"local-{backend}",
        "backend": backend,
        "model": "judge-model",
        "base_url": url if backend == "anthropic" else f"{url}/v1",
        "api_key": "sk-test",
        "timeout_s": 5.0,
        "max_retries": 0,
    }
    return JudgeConfig.model_validate(values | overrides)


@contextlib.asynccontextmanager
async def planted_chain_proxy(
    n: int, seed: int, planted: int, **settings: Any
) -> AsyncIterator[tuple[str, FakeUpstream]]:
    """The real proxy (uvicorn on 127.0.0.1) in front of a fake vLLM streaming `chain n= seed= planted=`
    chains instantly, with a local judge (`j`) that flags the planted sentence: (proxy URL, the fake vLLM)."""
    vllm = FakeUpstream(Chain(token_s=0.0, ttft_s=0.0))
    judge_app = create_judge_app({"unfaithful": [planted_sentence(n, seed, planted)]})
    with threaded_app(judge_app) as judge_url:
        judge = JudgeConfig(
            name="j", backend="anthropic", model="judge-model", base_url=judge_url, api_key="sk-test", max_retries=0
        )  # type: ignore[arg-type]
        config = Settings(upstream_url="http://vllm.test", judges=[judge], **settings)
        async with running_app(create_app(config, upstream_transport=vllm.transport())) as url:
            yield url, vllm
