"""Judge backends by configuration: `build_judge(JudgeConfig) -> JudgeBackend`.

The server builds every configured judge once (in its lifespan) and hands the mapping to the judge
detector; requests select one by name.
"""

from __future__ import annotations

from collections.abc import Iterable

from faithproxy.clients.anthropic_judge import AnthropicJudge
from faithproxy.clients.judge_base import JudgeBackend, JudgeConfig, JudgeResult
from faithproxy.clients.openai_judge import OpenAICompatibleJudge

__all__ = [
    "AnthropicJudge",
    "JudgeBackend",
    "JudgeConfig",
    "JudgeResult",
    "OpenAICompatibleJudge",
    "build_judge",
    "build_judges",
]

_BACKENDS: dict[str, type[JudgeBackend]] = {
    "anthropic": AnthropicJudge,
    "openai": OpenAICompatibleJudge,
}


def build_judge(config: JudgeConfig) -> JudgeBackend:
    """A backend for `config`; ValueError when its key is named by an unset environment variable."""
    return _BACKENDS[config.backend](config)


def build_judges(configs: Iterable[JudgeConfig]) -> dict[str, JudgeBackend]:
    """name → backend for every config; ValueError on a duplicate name."""
    judges: dict[str, JudgeBackend] = {}
    for config in configs:
        if config.name in judges:
            raise ValueError(f"two judges are named {config.name!r}")
        judges[config.name] = build_judge(config)
    return judges
