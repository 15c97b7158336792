"""Judge backends by configuration: `build_judge(JudgeConfig) -> JudgeBackend`.

The server builds every configured judge once (in its lifespan) and hands the mapping to the judge
detector; requests select one by name. Backends are registered by the `backend` field of a config
and imported when first built, so a server loads only the clients it configures (the anthropic SDK
only for a Claude judge; an OpenAI-compatible judge needs no SDK: clients/openai_judge.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from faithproxy.clients.judge_base import JudgeBackend, JudgeConfig, JudgeResult
from faithproxy.faithcore.registry import Entry, Registry

__all__ = [
    "BACKENDS",
    "JudgeBackend",
    "JudgeConfig",
    "JudgeResult",
    "build_judge",
    "build_judges",
]

# Keys are the values JudgeConfig.backend accepts (a test keeps the two the same).
BACKENDS: Registry[type[JudgeBackend]] = Registry(
    "judge backend",
    JudgeBackend,
    {
        "anthropic": Entry("faithproxy.clients.anthropic_judge:AnthropicJudge", "Anthropic Messages API (Claude)"),
        "openai": Entry(
            "faithproxy.clients.openai_judge:OpenAICompatibleJudge", "any OpenAI-compatible chat completions endpoint"
        ),
    },
)

_CLASSES = {"AnthropicJudge": "anthropic", "OpenAICompatibleJudge": "openai"}


def __getattr__(name: str) -> Any:
    """The backend classes (AnthropicJudge, OpenAICompatibleJudge), still importable from here, imported
    when first asked for."""
    if name in _CLASSES:
        return BACKENDS.resolve(_CLASSES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_judge(config: JudgeConfig) -> JudgeBackend:
    """A backend for `config`; ValueError when its key is named by an unset environment variable."""
    return BACKENDS.resolve(config.backend)(config)


def build_judges(configs: Iterable[JudgeConfig]) -> dict[str, JudgeBackend]:
    """name → backend for every config; ValueError on a duplicate name."""
    judges: dict[str, JudgeBackend] = {}
    for config in configs:
        if config.name in judges:
            raise ValueError(f"two judges are named {config.name!r}")
        judges[config.name] = build_judge(config)
    return judges
