"""A real `JudgeBackend` whose replies are canned by a substring of the prompt (for the scorers' judges)."""

from __future__ import annotations

from collections.abc import Sequence

from faithproxy.clients.judge_base import JudgeBackend, JudgeConfig, JudgeResult
from faithproxy.faithcore.images import ImageRef


class CannedJudge(JudgeBackend):
    """`replies` maps a substring of the user prompt to the reply (or an exception to raise); the first
    key found in the prompt wins. Every prompt is kept in `prompts`."""

    def __init__(self, replies: dict[str, str | Exception], name: str = "canned") -> None:
        super().__init__(JudgeConfig(name=name, backend="openai", model="m", api_key="k"))
        self.replies = replies
        self.prompts: list[str] = []

    async def complete(self, system: str, user: str, images: Sequence[ImageRef] = ()) -> JudgeResult:
        self.prompts.append(user)
        reply = next(v for k, v in self.replies.items() if k in user)
        if isinstance(reply, Exception):
            raise reply
        return JudgeResult(reply, 10, 2, 0.01)

    async def aclose(self) -> None:
        pass
