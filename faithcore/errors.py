"""The one exception tree of faithproxy.

    FaithproxyError                 500 server_error
    ├── PolicyError                 400 invalid_request_error   (a bad header or body value)
    │   ├── ImageRefused            400 invalid_request_error   (a media URL the proxy will not pass on,
    │   │                                                         an image URL the fetch policy refuses,
    │   │                                                         or one that could not be fetched)
    │   ├── PayloadTooLarge         413 invalid_request_error   (request body or one image too large)
    │   ├── HeadersTooLarge         431 invalid_request_error
    │   ├── RequestTimeout          408 invalid_request_error   (headers or body not in within the client
    │   │                                                         timeouts: server/admission/connections.py)
    │   ├── ProbeMismatch           409 invalid_request_error   (the probe was trained for another model
    │   │                                                         or other layers than it is asked to read)
    │   └── PolicyForbidden         403 invalid_request_error   (a header, or the default it falls back to,
    │                                                             outside the API key's policy)
    ├── AuthError                   401 invalid_request_error   (missing or wrong proxy API key)
    ├── Overloaded                  429 rate_limit_error        (concurrency limit, or one client's, reached;
    │                                                             Retry-After)
    ├── UpstreamError               502 upstream_error          (vLLM failed or is unreachable)
    │   └── UpstreamStatusError     status of vLLM's own reply, its message passed on
    ├── DetectorError               502 detector_error          (judge down, garbage reply, ...)
    ├── RegenerationError           502 regeneration_error
    └── BenchmarkError              offline tools only (faithproxy bench/probe): a bad labelled file,
                                    metric inputs that do not match, a replay that cannot run; also a
                                    ValueError, so callers that catch that keep working

Each class carries the OpenAI error `type` and HTTP status it maps to; server/protocol/errors.py turns any of
them into an OpenAI-format error body (or a final SSE error frame once the stream has started).

The `code` of an UpstreamError and of a DetectorError is a member of `UpstreamErrorCode` and
`DetectorErrorCode`: the metrics label their error counters with exactly these sets (server/observe/metrics.py
builds its label tuples from the enums), so a new reason cannot be raised without also being counted.
A StrEnum member is its string: error bodies and traces carry the member's `code` string.
"""

from __future__ import annotations

import enum


class UpstreamErrorCode(enum.StrEnum):
    """Why talking to vLLM failed (the `reason` of faithproxy_upstream_errors_total)."""

    CONNECT = "connect"  # unreachable, or it stalled before its first byte
    STATUS = "status"  # vLLM answered an HTTP error (UpstreamStatusError, which carries no code itself)
    STREAM_BROKEN = "stream_broken"
    STREAM_TRUNCATED = "stream_truncated"  # the stream ended without [DONE]
    STALLED = "stalled"  # no data within the idle timeout
    MALFORMED = "malformed"  # a body or chunk that is not the JSON it should be
    STREAM_ERROR = "stream_error"  # vLLM reported an error inside the stream
    NO_HIDDEN_STATES = "no_hidden_states"  # the hidden-states route gave no (readable) file
    OTHER = "other"


class DetectorErrorCode(enum.StrEnum):
    """Why a detector call failed (the `reason` of faithproxy_detector_errors_total)."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"
    STATUS_429 = "status_429"
    STATUS_5XX = "status_5xx"
    STATUS_4XX = "status_4xx"  # any other 4xx: the judge's number is in the message
    BAD_RESPONSE = "bad_response"  # a reply body of the wrong shape
    EMPTY_REPLY = "empty_reply"
    SDK_ERROR = "sdk_error"  # any other failure inside a vendor SDK
    UNPARSEABLE = "unparseable"  # a reply with no verdict the parser can read
    UNKNOWN_JUDGE = "unknown_judge"
    OTHER = "other"


class FaithproxyError(Exception):
    status_code = 500
    error_type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class BenchmarkError(FaithproxyError, ValueError):
    """An offline tool cannot do what it was asked (never raised while serving requests)."""


class PolicyError(FaithproxyError):
    status_code = 400
    error_type = "invalid_request_error"


class ImageRefused(PolicyError):
    """A media URL the proxy will not send on or fetch (checked on every request), or an http(s) image
    the fetch policy refuses or that could not be fetched; raised before anything is sent upstream.
    The message names the image (its part, or its position)."""

    def __init__(self, message: str, *, code: str = "image_refused") -> None:
        super().__init__(message, param="messages", code=code)


class PayloadTooLarge(PolicyError):
    status_code = 413


class HeadersTooLarge(PolicyError):
    status_code = 431


class RequestTimeout(PolicyError):
    status_code = 408


class ProbeMismatch(PolicyError):
    status_code = 409

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code="probe_mismatch")


class PolicyForbidden(PolicyError):
    """A request asks for (or would default to) what its API key's policy does not allow
    (server/admission/key_policy.py); `param` names the header, the message the allowed values."""

    status_code = 403

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code="forbidden_by_policy")


class AuthError(FaithproxyError):
    status_code = 401
    error_type = "invalid_request_error"


class Overloaded(FaithproxyError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int, code: str = "too_many_concurrent_requests") -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class UpstreamError(FaithproxyError):
    status_code = 502
    error_type = "upstream_error"

    def __init__(self, message: str, *, code: UpstreamErrorCode | str | None = None) -> None:
        # a string that is not a member fails here, at the raise site, not as an uncounted label
        super().__init__(message, code=None if code is None else UpstreamErrorCode(code))


class UpstreamStatusError(UpstreamError):
    def __init__(self, message: str, *, status_code: int, body: object = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class DetectorError(FaithproxyError):
    """No code (None) is counted as "other" but keeps the error body's `code` null, as it always was."""

    status_code = 502
    error_type = "detector_error"

    def __init__(self, message: str, *, code: DetectorErrorCode | str | None = None) -> None:
        super().__init__(message, code=None if code is None else DetectorErrorCode(code))


class RegenerationError(FaithproxyError):
    status_code = 502
    error_type = "regeneration_error"
