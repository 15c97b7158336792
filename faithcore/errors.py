"""The one exception tree of faithproxy.

    FaithproxyError                 500 server_error
    ├── PolicyError                 400 invalid_request_error   (a bad header or body value)
    │   ├── ImageRefused            400 invalid_request_error   (an image URL the fetch policy refuses,
    │   │                                                         or one that could not be fetched)
    │   ├── PayloadTooLarge         413 invalid_request_error   (request body or one image too large)
    │   ├── HeadersTooLarge         431 invalid_request_error
    │   └── ProbeMismatch           409 invalid_request_error   (the probe was trained for another model
    │                                                             or other layers than it is asked to read)
    ├── AuthError                   401 invalid_request_error   (missing or wrong proxy API key)
    ├── Overloaded                  429 rate_limit_error        (concurrency limit reached; Retry-After)
    ├── UpstreamError               502 upstream_error          (vLLM failed or is unreachable)
    │   └── UpstreamStatusError     status of vLLM's own reply, its message passed on
    ├── DetectorError               502 detector_error          (judge down, garbage reply, ...)
    ├── RegenerationError           502 regeneration_error
    └── BenchmarkError              offline tools only (faithproxy bench/probe): a bad labelled file,
                                    metric inputs that do not match, a replay that cannot run; also a
                                    ValueError, so callers that catch that keep working

Each class carries the OpenAI error `type` and HTTP status it maps to; server/errors.py turns any of
them into an OpenAI-format error body (or a final SSE error frame once the stream has started).
"""

from __future__ import annotations


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
    """An http(s) image the proxy would have to fetch for a judge, refused by the fetch policy or
    unreachable; raised before anything is sent upstream."""

    def __init__(self, message: str, *, code: str = "image_refused") -> None:
        super().__init__(message, param="messages", code=code)


class PayloadTooLarge(PolicyError):
    status_code = 413


class HeadersTooLarge(PolicyError):
    status_code = 431


class ProbeMismatch(PolicyError):
    status_code = 409

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code="probe_mismatch")


class AuthError(FaithproxyError):
    status_code = 401
    error_type = "invalid_request_error"


class Overloaded(FaithproxyError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, code="too_many_concurrent_requests")
        self.retry_after_s = retry_after_s


class UpstreamError(FaithproxyError):
    status_code = 502
    error_type = "upstream_error"


class UpstreamStatusError(UpstreamError):
    def __init__(self, message: str, *, status_code: int, body: object = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class DetectorError(FaithproxyError):
    status_code = 502
    error_type = "detector_error"


class RegenerationError(FaithproxyError):
    status_code = 502
    error_type = "regeneration_error"
