"""A judge reached through an OpenAI-compatible chat completions endpoint with the official `openai` SDK.

Any OpenAI-compatible VLM fits, e.g. Qwen2.5-VL-72B served by vLLM (`base_url=http://host:8000/v1`,
any key when the server has none configured). Images go as `image_url` parts carrying the client's URL
unchanged (data URL or http(s) URL), before the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import openai

from faithproxy.clients.judge_base import SdkErrorClasses, SdkJudge, usage_tokens
from faithproxy.faithcore.images import ImageRef


class OpenAICompatibleJudge(SdkJudge):
    """An OpenAI-compatible VLM as the judge."""

    client_class = openai.AsyncOpenAI
    errors = SdkErrorClasses.of(openai, base=openai.OpenAIError)

    async def _send(self, system: str, user: str, images: Sequence[ImageRef]) -> Any:
        content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": i.url}} for i in images]
        content.append({"type": "text", "text": user})
        extra: dict[str, Any] = {}
        if self.config.temperature is not None:
            extra["temperature"] = self.config.temperature
        return await self._client.chat.completions.create(
            model=self.config.model,
            max_tokens=self.config.max_tokens,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": content}],
            **extra,
        )

    def _read(self, reply: Any) -> tuple[str, int, int]:
        text = reply.choices[0].message.content or ""
        return text, usage_tokens(reply.usage, "prompt_tokens"), usage_tokens(reply.usage, "completion_tokens")
