"""What every judge backend shares: its configuration, its result record, and the interface.

A judge is an auxiliary VLM reached over HTTP: Claude through the anthropic SDK (`SdkJudge`), an
OpenAI-compatible server (vLLM) through a lean client of our own (clients/openai_judge.py). Backends
only move text and images: they know nothing about the judge prompt or its reply format (that is
`detectors/judge_prompt.py`). The user turn is plain text or a list of `TextBlock`s; a block marked
`cache` ends a prefix the caller will send again, and each backend uses what its vendor offers for that
(an Anthropic `cache_control` breakpoint; an OpenAI-compatible server such as vLLM caches prefixes by
itself, so the blocks are simply joined). Every reply's usage separates fresh, cache-read and
cache-written prompt tokens. Every failure leaves a backend as a `DetectorError` whose `.code` is a
`DetectorErrorCode` (`timeout`, `connection`, `status_429`, `status_5xx`, `status_4xx`, `bad_response`,
`empty_reply`, `sdk_error`), so metrics can label by it and the session can apply the request's on-error
policy.

Keys are `SecretStr` (or the name of an environment variable holding them) and never reach a repr, a
log record or an error message.
"""

from __future__ import annotations

import abc
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from faithproxy.clients.logprobs import TokenChoice
from faithproxy.faithcore.context import JudgeUsage
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode
from faithproxy.faithcore.images import ImageRef


class JudgeConfig(BaseModel):
    """One judge configured on the server; requests select it by `name` (never by URL or key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    backend: Literal["anthropic", "openai"]
    model: str = Field(min_length=1)
    base_url: str | None = None  # None: the vendor's default endpoint (the SDKs' default, or their *_BASE_URL)
    api_key: SecretStr | None = None
    api_key_env: str | None = None  # name of an environment variable holding the key
    timeout_s: float = Field(default=60.0, gt=0)  # per attempt: the connect, and each wait for the reply's bytes
    max_tokens: int = Field(default=1024, ge=16)
    max_retries: int = Field(default=1, ge=0, le=10)  # after a timeout, lost connection, 408, 409, 429 or 5xx
    # None: not sent, the model's default (some recent models accept nothing else); 0.0 for vLLM judges
    temperature: float | None = None
    # True: http(s) images are fetched by the proxy (under FAITHPROXY_IMAGE_FETCH__*, see
    # clients/image_fetch.py) and sent as base64; False: the judge gets the URL and fetches it itself.
    fetch_images: bool = False
    # Log-probabilities asked of an OpenAI-compatible judge: how many alternatives per token (None: not
    # asked; the judge's confidence is then unknown). Anthropic's API has none to give.
    top_logprobs: int | None = Field(default=5, ge=1, le=20)
    # A flag whose confidence (P(UNFAITHFUL) of the flagged sentence) is under this is delivered as
    # `unsure` and never rewritten; None: every flag is acted on. A request may raise it, not lower it.
    flag_threshold: float | None = Field(default=None, ge=0.0, le=1.0)

    def resolved_api_key(self) -> str:
        """The key: `api_key`, else the variable named by `api_key_env`, else the SDK's usual variable.

        A judge without a key fails here, at startup, not on the first request. Keyless local servers
        (vLLM without --api-key) take any placeholder, e.g. "EMPTY".
        """
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        env = self.api_key_env or _SDK_KEY_ENV[self.backend]
        value = os.environ.get(env)
        if not value:
            raise ValueError(f"judge {self.name}: no api key (set api_key, or the environment variable {env})")
        return value


_SDK_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


@dataclass(frozen=True)
class TextBlock:
    """A piece of the user turn. `cache`: the prompt up to and including this block is a prefix that
    later calls repeat, worth a cache breakpoint where the vendor wants one marked."""

    text: str
    cache: bool = False


UserTurn = str | Sequence[TextBlock]


def turn_text(user: UserTurn) -> str:
    """The user turn as one text: blocks are joined with nothing between them, so a prompt renders to
    the same characters however it is cut into blocks."""
    return user if isinstance(user, str) else "".join(block.text for block in user)


@dataclass(frozen=True)
class TokenCounts:
    """A reply's usage. `input_tokens` excludes the prompt tokens read from or written to a cache."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    cache_creation_tokens: int = 0


@dataclass(frozen=True)
class JudgeResult:
    """A judge's reply: its text, the tokens it cost, and how long the call took (retries included).

    `input_tokens` are the prompt tokens billed at the full price; `cached_input_tokens` and
    `cache_creation_tokens` the ones read from and written to the judge's prompt cache.
    """

    text: str
    input_tokens: int
    output_tokens: int
    latency_s: float
    cached_input_tokens: int = 0
    cache_creation_tokens: int = 0
    # the reply's tokens with their log-probabilities, when the backend asked for them and got them
    tokens: tuple[TokenChoice, ...] | None = None

    def usage(self) -> JudgeUsage:
        """This call as one line of a request's judge bill."""
        return JudgeUsage(
            calls=1,
            input_tokens=self.input_tokens,
            cached_input_tokens=self.cached_input_tokens,
            cache_creation_tokens=self.cache_creation_tokens,
            output_tokens=self.output_tokens,
        )


class JudgeBackend(abc.ABC):
    """Sends one (system, user text, images) turn to a judge model and returns the reply text.

    One client (one connection pool) per backend, created in the constructor and reused for every
    call; `aclose()` releases it.
    """

    def __init__(self, config: JudgeConfig) -> None:
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def model(self) -> str:
        return self.config.model

    @abc.abstractmethod
    async def complete(self, system: str, user: UserTurn, images: Sequence[ImageRef] = ()) -> JudgeResult:
        """The judge's reply to one turn; failures raise `DetectorError` with a reason `.code`."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the pooled client."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.config.name!r}, model={self.config.model!r}, "
            f"base_url={self.config.base_url!r})"
        )


def judge_error(name: str, code: DetectorErrorCode, detail: str) -> DetectorError:
    """A `DetectorError` naming the judge and a reason; `detail` must never contain request data."""
    return DetectorError(f"judge {name} failed ({code}): {detail}", code=code)


def judge_result(
    name: str, started: float, text: str, counts: TokenCounts, tokens: tuple[TokenChoice, ...] | None = None
) -> JudgeResult:
    """The result of a call begun at `started` (perf_counter) whose reply was read; a reply with no text
    is an `empty_reply` failure."""
    if not text.strip():
        raise judge_error(name, DetectorErrorCode.EMPTY_REPLY, "the reply has no text")
    return JudgeResult(
        text,
        counts.input_tokens,
        counts.output_tokens,
        time.perf_counter() - started,
        cached_input_tokens=counts.cached_input_tokens,
        cache_creation_tokens=counts.cache_creation_tokens,
        tokens=tokens,
    )


def status_code_reason(status: int) -> DetectorErrorCode:
    """Reason code of an HTTP error status: 429 (rate limited) on its own, the other 4xx and the 5xx as
    two classes; the number itself goes into the message."""
    if status == 429:
        return DetectorErrorCode.STATUS_429
    return DetectorErrorCode.STATUS_5XX if status >= 500 else DetectorErrorCode.STATUS_4XX


@dataclass(frozen=True)
class SdkErrorClasses:
    """The exception classes of one vendor SDK (Stainless-generated SDKs, the anthropic one among them,
    share this shape)."""

    base: type[Exception]
    timeout: type[Exception]
    connection: type[Exception]
    status: type[Exception]
    validation: type[Exception]

    @classmethod
    def of(cls, sdk: ModuleType, base: type[Exception]) -> SdkErrorClasses:
        """The classes of `sdk`: generated SDKs name them alike, but their base."""
        return cls(
            base, sdk.APITimeoutError, sdk.APIConnectionError, sdk.APIStatusError, sdk.APIResponseValidationError
        )


def map_sdk_error(name: str, exc: Exception, classes: SdkErrorClasses) -> DetectorError:
    """The `DetectorError` for an SDK failure; the message names the class and status, never a key."""
    kind = type(exc).__name__
    if isinstance(exc, classes.timeout):
        return judge_error(name, DetectorErrorCode.TIMEOUT, kind)
    if isinstance(exc, classes.connection):
        return judge_error(name, DetectorErrorCode.CONNECTION, kind)
    if isinstance(exc, classes.status):
        status = int(getattr(exc, "status_code", 0) or 0)
        return judge_error(name, status_code_reason(status), f"{kind}, HTTP {status}")
    if isinstance(exc, classes.validation | ValueError | KeyError | TypeError | AttributeError | IndexError):
        return judge_error(name, DetectorErrorCode.BAD_RESPONSE, kind)
    return judge_error(name, DetectorErrorCode.SDK_ERROR, kind)


class SdkJudge(JudgeBackend):
    """A backend over one vendor SDK's async client (the anthropic SDK's for Claude). A subclass says how
    one turn is sent (`_send`) and how the reply is read (`_read`); timing, error mapping and the
    empty-reply check are here.
    """

    client_class: ClassVar[type[Any]]  # the SDK's async client (api_key, base_url, timeout, max_retries)
    errors: ClassVar[SdkErrorClasses]

    def __init__(self, config: JudgeConfig) -> None:
        super().__init__(config)
        self._client = self.client_class(
            api_key=config.resolved_api_key(),
            base_url=config.base_url,
            timeout=config.timeout_s,
            max_retries=config.max_retries,
        )

    @abc.abstractmethod
    async def _send(self, system: str, user: Sequence[TextBlock], images: Sequence[ImageRef]) -> Any:
        """The SDK's reply object to one turn."""

    @abc.abstractmethod
    def _read(self, reply: Any) -> tuple[str, TokenCounts]:
        """(text, usage) of a reply; raises when the reply has the wrong shape."""

    async def complete(self, system: str, user: UserTurn, images: Sequence[ImageRef] = ()) -> JudgeResult:
        started = time.perf_counter()
        blocks = [TextBlock(user)] if isinstance(user, str) else list(user)
        try:
            reply = await self._send(system, blocks, images)
        except (self.errors.base, json.JSONDecodeError) as exc:  # the SDKs let a non-JSON body through
            raise map_sdk_error(self.name, exc, self.errors) from exc
        try:  # the SDKs do not validate bodies: a reply of the wrong shape fails here
            text, counts = self._read(reply)
        except (AttributeError, TypeError, ValueError, IndexError) as exc:
            raise map_sdk_error(self.name, exc, self.errors) from exc
        return judge_result(self.name, started, text, counts)

    async def aclose(self) -> None:
        await self._client.close()


def usage_tokens(usage: Any, field: str) -> int:
    """A token count from an SDK usage record; a missing record or field counts 0."""
    return int(getattr(usage, field, 0) or 0)
