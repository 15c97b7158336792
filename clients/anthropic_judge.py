"""A judge reached through Anthropic's Messages API with the official `anthropic` SDK (Claude).

Images go first in the user turn (Anthropic's advice for vision prompts): a data URL as a base64 image
block, its payload passed on exactly as the client sent it (no decode, no re-encode); an http(s) URL as
a URL image source, which Anthropic fetches itself.

Prompt caching: each `TextBlock` becomes one text block, and a block marked `cache` carries an
ephemeral `cache_control` breakpoint (Anthropic allows four per request; the first four marked are
kept). Anthropic caches the prompt up to a breakpoint and, on a later call, also finds a cached prefix
that ends at an earlier block boundary, which is why callers keep their block boundaries stable from
call to call. The reply's usage separates `input_tokens` (after the last cache hit or write),
`cache_read_input_tokens` and `cache_creation_input_tokens`; all three are recorded. A prefix shorter
than the model's minimum (1,024 tokens and up, by model) is silently not cached: both counts stay 0.

The Messages API returns no token log-probabilities, so this judge's confidence in a flag is unknown
(`Verdict.confidence` None, `null` in the step annotation; docs/judge.md, "Confidence").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anthropic

from faithproxy.clients.judge_base import SdkErrorClasses, SdkJudge, TextBlock, TokenCounts, usage_tokens
from faithproxy.faithcore.images import ImageRef

MAX_BREAKPOINTS = 4  # Anthropic's limit per request
EPHEMERAL = {"type": "ephemeral"}


def image_block(image: ImageRef) -> dict[str, Any]:
    if image.is_data_url:
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": image.media_type, "data": image.base64_data},
        }
    return {"type": "image", "source": {"type": "url", "url": image.url}}


def text_blocks(blocks: Sequence[TextBlock]) -> list[dict[str, Any]]:
    """The text blocks of a user turn, `cache_control` on the first MAX_BREAKPOINTS marked ones."""
    out: list[dict[str, Any]] = []
    marks = 0
    for block in blocks:
        part: dict[str, Any] = {"type": "text", "text": block.text}
        if block.cache and marks < MAX_BREAKPOINTS:
            part["cache_control"] = EPHEMERAL
            marks += 1
        out.append(part)
    return out


class AnthropicJudge(SdkJudge):
    """Claude (or anything speaking the Messages API) as the judge."""

    client_class = anthropic.AsyncAnthropic
    errors = SdkErrorClasses.of(anthropic, base=anthropic.AnthropicError)

    async def _send(self, system: str, user: Sequence[TextBlock], images: Sequence[ImageRef]) -> Any:
        content = [image_block(image) for image in images] + text_blocks(user)
        # temperature travels in the body: recent SDK versions dropped the keyword, the API keeps it
        extra_body = {} if self.config.temperature is None else {"temperature": self.config.temperature}
        return await self._client.messages.create(
            model=self.config.model,
            max_tokens=self.config.max_tokens,
            system=system,
            messages=[{"role": "user", "content": content}],
            extra_body=extra_body or None,
        )

    def _read(self, reply: Any) -> tuple[str, TokenCounts]:
        text = "".join(block.text for block in reply.content if getattr(block, "type", None) == "text")
        usage = reply.usage
        return text, TokenCounts(
            input_tokens=usage_tokens(usage, "input_tokens"),
            output_tokens=usage_tokens(usage, "output_tokens"),
            cached_input_tokens=usage_tokens(usage, "cache_read_input_tokens"),
            cache_creation_tokens=usage_tokens(usage, "cache_creation_input_tokens"),
        )
