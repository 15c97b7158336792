"""A judge reached through Anthropic's Messages API with the official `anthropic` SDK (Claude).

Images go first in the user turn (Anthropic's advice for vision prompts): a data URL as a base64 image
block, its payload passed on exactly as the client sent it (no decode, no re-encode); an http(s) URL as
a URL image source, which Anthropic fetches itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anthropic

from faithproxy.clients.judge_base import SdkErrorClasses, SdkJudge, usage_tokens
from faithproxy.faithcore.images import ImageRef


def image_block(image: ImageRef) -> dict[str, Any]:
    if image.is_data_url:
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": image.media_type, "data": image.base64_data},
        }
    return {"type": "image", "source": {"type": "url", "url": image.url}}


class AnthropicJudge(SdkJudge):
    """Claude (or anything speaking the Messages API) as the judge."""

    client_class = anthropic.AsyncAnthropic
    errors = SdkErrorClasses.of(anthropic, base=anthropic.AnthropicError)

    async def _send(self, system: str, user: str, images: Sequence[ImageRef]) -> Any:
        content = [image_block(image) for image in images] + [{"type": "text", "text": user}]
        # temperature travels in the body: recent SDK versions dropped the keyword, the API keeps it
        extra_body = {} if self.config.temperature is None else {"temperature": self.config.temperature}
        return await self._client.messages.create(
            model=self.config.model,
            max_tokens=self.config.max_tokens,
            system=system,
            messages=[{"role": "user", "content": content}],
            extra_body=extra_body or None,
        )

    def _read(self, reply: Any) -> tuple[str, int, int]:
        text = "".join(block.text for block in reply.content if getattr(block, "type", None) == "text")
        return text, usage_tokens(reply.usage, "input_tokens"), usage_tokens(reply.usage, "output_tokens")
