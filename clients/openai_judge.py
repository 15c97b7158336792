"""A judge reached through an OpenAI-compatible chat completions endpoint with the official `openai` SDK.

Any OpenAI-compatible VLM fits, e.g. Qwen2.5-VL-72B served by vLLM (`base_url=http://host:8000/v1`,
any key when the server has none configured). Images go as `image_url` parts carrying the client's URL
unchanged (data URL or http(s) URL), before the text.

Prompt caching needs nothing marked here: vLLM's automatic prefix caching (on by default in its V1
engine; images take part through their content hash) and OpenAI's own caching reuse any prompt prefix
they have seen, token for token. So the text blocks are joined into ONE text part: the characters of
the prompt, and therefore its tokens, never depend on where a caller cut it into blocks. The cached
share of the prompt comes from `usage.prompt_tokens_details.cached_tokens` (vLLM fills it when started
with `--enable-prompt-tokens-details`; without it every prompt token counts as uncached).

With `top_logprobs` set (the default) the call asks for the reply's token log-probabilities, which the
judge detector turns into its confidence in a flag (detectors/judge_confidence.py); vLLM serves them
for any model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import openai

from faithproxy.clients.judge_base import SdkErrorClasses, SdkJudge, TextBlock, TokenCounts, turn_text, usage_tokens
from faithproxy.clients.logprobs import TokenChoice, completion_tokens
from faithproxy.faithcore.images import ImageRef


class OpenAICompatibleJudge(SdkJudge):
    """An OpenAI-compatible VLM as the judge."""

    client_class = openai.AsyncOpenAI
    errors = SdkErrorClasses.of(openai, base=openai.OpenAIError)

    async def _send(self, system: str, user: Sequence[TextBlock], images: Sequence[ImageRef]) -> Any:
        content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": i.url}} for i in images]
        content.append({"type": "text", "text": turn_text(user)})
        extra: dict[str, Any] = {}
        if self.config.temperature is not None:
            extra["temperature"] = self.config.temperature
        if self.config.top_logprobs is not None:
            extra.update(logprobs=True, top_logprobs=self.config.top_logprobs)
        return await self._client.chat.completions.create(
            model=self.config.model,
            max_tokens=self.config.max_tokens,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": content}],
            **extra,
        )

    def _read(self, reply: Any) -> tuple[str, TokenCounts]:
        text = reply.choices[0].message.content or ""
        usage = reply.usage
        prompt = usage_tokens(usage, "prompt_tokens")
        cached = min(prompt, usage_tokens(getattr(usage, "prompt_tokens_details", None), "cached_tokens"))
        return text, TokenCounts(
            input_tokens=prompt - cached,
            output_tokens=usage_tokens(usage, "completion_tokens"),
            cached_input_tokens=cached,
        )

    def _tokens(self, reply: Any) -> tuple[TokenChoice, ...] | None:
        return completion_tokens(reply)
