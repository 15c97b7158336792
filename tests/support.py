"""Helpers shared by the tests that run the proxy against real vLLM and the local judge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.settings import Settings


def local_judge_settings(vllm_url: str, judge_url: str, **overrides: Any) -> Settings:
    """Proxy settings with the local judge behind both wire protocols: `claude` (Anthropic Messages,
    the default) and `qwen` (OpenAI chat). Greedy regeneration: the fixture model is trained for it."""
    judges = [
        JudgeConfig(name="claude", backend="anthropic", model="judge", base_url=judge_url, api_key="k1",
                    timeout_s=5, max_retries=0),
        JudgeConfig(name="qwen", backend="openai", model="judge", base_url=f"{judge_url}/v1", api_key="k2",
                    timeout_s=5, max_retries=0, temperature=0.0),
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
