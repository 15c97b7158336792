"""A judge reached through an OpenAI-compatible chat completions endpoint, over the proxy's own lean
HTTP/1.1 client (clients/upstream_http.py) rather than the `openai` SDK.

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

Why not the SDK: it spent about 1.8 ms of the proxy's CPU on every call building, sending and
validating it through its layers (issue 49; benchmarks/performance/judge_client_cost.py). Here one
pool of keep-alive connections, the fixed headers (the key among them) and the request's fixed fields
are made once; a call is one `json.dumps` of the messages, one write, and one `json.loads` of the
reply. What the SDK did is kept: `timeout_s` bounds the connect and every wait for the reply's next
bytes; `max_retries` more attempts after a timeout, a broken connection, or HTTP 408, 409, 429 or 5xx,
after the server's Retry-After (up to 60 s; a longer one is not waited for) or else 0.5 s doubling
up to 8 s, less up to a quarter at random; the key from OPENAI_API_KEY and the endpoint from
OPENAI_BASE_URL when the config names none. Not kept: HTTP proxies named in the environment
(HTTPS_PROXY); the judge is reached directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Sequence
from typing import Any

from faithproxy.clients.judge_base import (
    JudgeBackend,
    JudgeConfig,
    JudgeResult,
    TokenCounts,
    UserTurn,
    judge_error,
    judge_result,
    status_code_reason,
    turn_text,
)
from faithproxy.clients.logprobs import completion_tokens
from faithproxy.clients.upstream_http import UpstreamPool
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode, UpstreamError, UpstreamErrorCode
from faithproxy.faithcore.images import ImageRef

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_RETRY_AFTER_S = 60.0


class OpenAICompatibleJudge(JudgeBackend):
    """An OpenAI-compatible VLM as the judge."""

    def __init__(self, config: JudgeConfig) -> None:
        super().__init__(config)
        base_url = config.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self._client = UpstreamPool(base_url, api_key=config.resolved_api_key(), connect_timeout_s=config.timeout_s)
        fields: dict[str, Any] = {"model": config.model, "max_tokens": config.max_tokens}
        if config.temperature is not None:
            fields["temperature"] = config.temperature
        if config.top_logprobs is not None:
            fields |= {"logprobs": True, "top_logprobs": config.top_logprobs}
        self._fields = json.dumps(fields)[:-1]  # the request's JSON up to its closing brace

    def request_body(self, system: str, user: UserTurn, images: Sequence[ImageRef]) -> bytes:
        content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": i.url}} for i in images]
        content.append({"type": "text", "text": turn_text(user)})
        messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
        return f'{self._fields}, "messages": {json.dumps(messages)}}}'.encode()

    async def complete(self, system: str, user: UserTurn, images: Sequence[ImageRef] = ()) -> JudgeResult:
        started = time.perf_counter()
        body = self.request_body(system, user, images)
        for attempt in range(self.config.max_retries + 1):
            try:
                status, headers, data = await self._post(body)
            except UpstreamError as exc:
                error, delay = transport_error(self.name, exc), backoff_s(attempt)
            else:
                if 200 <= status < 300:
                    return self._result(started, data)
                error = judge_error(self.name, status_code_reason(status), f"HTTP {status}")
                delay = retry_delay_s(status, headers, attempt)
            if delay is None or attempt == self.config.max_retries:
                break
            await asyncio.sleep(delay)
        raise error

    async def _post(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        response = await self._client.request(
            "POST", "/chat/completions", content=body, read_timeout_s=self.config.timeout_s
        )
        try:
            return response.status, response.headers, await response.read()
        finally:
            await response.aclose()

    def _result(self, started: float, data: bytes) -> JudgeResult:
        try:
            reply = json.loads(data)
            text, counts = read_reply(reply)
            tokens = completion_tokens(reply)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:  # JSON errors are ValueErrors
            raise judge_error(self.name, DetectorErrorCode.BAD_RESPONSE, type(exc).__name__) from exc
        return judge_result(self.name, started, text, counts, tokens)

    async def aclose(self) -> None:
        await self._client.aclose()


def read_reply(reply: dict[str, Any]) -> tuple[str, TokenCounts]:
    """(text, usage) of a chat completion's JSON; raises when it has the wrong shape. A missing usage
    (or field) counts 0; the cached share of the prompt is not counted as fresh input."""
    text = reply["choices"][0]["message"]["content"] or ""
    if not isinstance(text, str):
        raise TypeError("the message content is not text")
    usage = reply.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = min(prompt, int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0))
    return text, TokenCounts(prompt - cached, int(usage.get("completion_tokens") or 0), cached)


def transport_error(name: str, exc: UpstreamError) -> DetectorError:
    """A failure to get a whole reply: `timeout` when the judge stayed silent (or the connect timed out),
    else `connection`."""
    cause = exc.__cause__
    timed_out = exc.code == UpstreamErrorCode.STALLED or isinstance(cause, TimeoutError)
    code = DetectorErrorCode.TIMEOUT if timed_out else DetectorErrorCode.CONNECTION
    error = judge_error(name, code, f"{exc.code}" + (f" ({type(cause).__name__})" if cause else ""))
    error.__cause__ = exc
    return error


def retry_delay_s(status: int, headers: dict[str, str], attempt: int) -> float | None:
    """Seconds before another attempt after HTTP `status` (the SDKs' rule); None: none is worth it."""
    if status < 500 and status not in (408, 409, 429):
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            after = float(headers[name]) * scale
        except (KeyError, ValueError):
            continue
        if after > MAX_RETRY_AFTER_S:
            return None
        if after > 0:
            return after
        break
    return backoff_s(attempt)


def backoff_s(attempt: int) -> float:
    """The wait after failed attempt `attempt` (0 first): 0.5 s doubling up to 8 s, less up to 25 %."""
    return min(0.5 * 2.0**attempt, 8.0) * (1 - 0.25 * random.random())
