"""A judge reached through an OpenAI-compatible chat completions endpoint with the official `openai` SDK.

Any OpenAI-compatible VLM fits, e.g. Qwen2.5-VL-72B served by vLLM (`base_url=http://host:8000/v1`,
any key when the server has none configured). Images go as `image_url` parts carrying the client's URL
unchanged (data URL or http(s) URL), before the text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import openai

from faithproxy.clients.judge_base import (
    JudgeBackend,
    JudgeConfig,
    JudgeResult,
    SdkErrorClasses,
    judge_error,
    map_sdk_error,
)
from faithproxy.faithcore.images import ImageRef

_ERRORS = SdkErrorClasses(
    base=openai.OpenAIError,
    timeout=openai.APITimeoutError,
    connection=openai.APIConnectionError,
    status=openai.APIStatusError,
    validation=openai.APIResponseValidationError,
)


class OpenAICompatibleJudge(JudgeBackend):
    """An OpenAI-compatible VLM as the judge."""

    def __init__(self, config: JudgeConfig) -> None:
        super().__init__(config)
        self._client = openai.AsyncOpenAI(
            api_key=config.resolved_api_key(),
            base_url=config.base_url,
            timeout=config.timeout_s,
            max_retries=config.max_retries,
        )

    async def complete(self, system: str, user: str, images: Sequence[ImageRef] = ()) -> JudgeResult:
        content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": i.url}} for i in images]
        content.append({"type": "text", "text": user})
        extra: dict[str, Any] = {}
        if self.config.temperature is not None:
            extra["temperature"] = self.config.temperature
        started = time.perf_counter()
        try:
            completion = await self._client.chat.completions.create(
                model=self.config.model,
                max_tokens=self.config.max_tokens,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": content},  # type: ignore[misc,list-item]
                ],
                **extra,
            )
        except (_ERRORS.base, json.JSONDecodeError) as exc:  # the SDK lets a non-JSON body through
            raise map_sdk_error(self.name, exc, _ERRORS) from exc
        try:  # the SDK does not validate bodies: a reply of the wrong shape fails here
            text = completion.choices[0].message.content or ""
            input_tokens = int(getattr(completion.usage, "prompt_tokens", 0) or 0)
            output_tokens = int(getattr(completion.usage, "completion_tokens", 0) or 0)
        except (AttributeError, TypeError, ValueError, IndexError) as exc:
            raise map_sdk_error(self.name, exc, _ERRORS) from exc
        if not text.strip():
            raise judge_error(self.name, "empty_reply", "the reply has no text")
        return JudgeResult(text, input_tokens, output_tokens, time.perf_counter() - started)

    async def aclose(self) -> None:
        await self._client.close()
