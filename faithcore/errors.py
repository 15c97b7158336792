"""The one exception tree of faithproxy.

    FaithproxyError                 500 server_error
    ├── PolicyError                 400 invalid_request_error   (a bad header or body value)
    ├── UpstreamError               502 upstream_error          (vLLM failed or is unreachable)
    │   └── UpstreamStatusError     status of vLLM's own reply, its message passed on
    ├── DetectorError               502 detector_error          (judge down, garbage reply, ...)
    └── RegenerationError           502 regeneration_error

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


class PolicyError(FaithproxyError):
    status_code = 400
    error_type = "invalid_request_error"


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
