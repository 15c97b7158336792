"""A judge reached through Anthropic's Messages API with the official `anthropic` SDK (Claude).

Images go first in the user turn (Anthropic's advice for vision prompts): a data URL as a base64 image
block, its payload passed on exactly as the client sent it (no decode, no re-encode); an http(s) URL as
a URL image source, which Anthropic fetches itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import anthropic

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
    base=anthropic.AnthropicError,
    timeout=anthropic.APITimeoutError,
    connection=anthropic.APIConnectionError,
    status=anthropic.APIStatusError,
    validation=anthropic.APIResponseValidationError,
)


def image_block(image: ImageRef) -> dict[str, Any]:
    if image.is_data_url:
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": image.media_type, "data": image.base64_data},
        }
    return {"type": "image", "source": {"type": "url", "url": image.url}}


class AnthropicJudge(JudgeBackend):
    """Claude (or anything speaking the Messages API) as the judge."""

    def __init__(self, config: JudgeConfig) -> None:
        super().__init__(config)
        self._client = anthropic.AsyncAnthropic(
            api_key=config.resolved_api_key(),
            base_url=config.base_url,
            timeout=config.timeout_s,
            max_retries=config.max_retries,
        )

    async def complete(self, system: str, user: str, images: Sequence[ImageRef] = ()) -> JudgeResult:
        content = [image_block(image) for image in images] + [{"type": "text", "text": user}]
        # temperature travels in the body: recent SDK versions dropped the keyword, the API keeps it
        extra_body = {} if self.config.temperature is None else {"temperature": self.config.temperature}
        started = time.perf_counter()
        try:
            message = await self._client.messages.create(
                model=self.config.model,
                max_tokens=self.config.max_tokens,
                system=system,
                messages=[{"role": "user", "content": content}],  # type: ignore[typeddict-item]
                extra_body=extra_body or None,
            )
        except (_ERRORS.base, json.JSONDecodeError) as exc:  # the SDK lets a non-JSON body through
            raise map_sdk_error(self.name, exc, _ERRORS) from exc
        try:  # the SDK does not validate bodies: a reply of the wrong shape fails here
            text = "".join(block.text for block in message.content if getattr(block, "type", None) == "text")
            input_tokens = int(getattr(message.usage, "input_tokens", 0) or 0)
            output_tokens = int(getattr(message.usage, "output_tokens", 0) or 0)
        except (AttributeError, TypeError, ValueError) as exc:
            raise map_sdk_error(self.name, exc, _ERRORS) from exc
        if not text.strip():
            raise judge_error(self.name, "empty_reply", "the reply has no text")
        return JudgeResult(text, input_tokens, output_tokens, time.perf_counter() - started)

    async def aclose(self) -> None:
        await self._client.close()
