"""Counting refusals by reason (faithproxy_refusals_total): a request answered before it was served.

Each place that refuses a request (the API-key check, the size and concurrency limits, the client
timeouts, admission's body, header and policy checks) calls `count_refusal` with the error it answers;
the reason is read from its HTTP status, so a new refusal of a known status needs no new label.
"""

from __future__ import annotations

from typing import Protocol

from starlette.types import Scope

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.observe.metrics import NOT_A_DOOR, Metrics, RefusalReason
from faithproxy.server.protocol.errors import door_at

_BY_STATUS = {
    401: RefusalReason.AUTHENTICATION,
    408: RefusalReason.TIMEOUTS,
    413: RefusalReason.LIMITS,
    429: RefusalReason.LIMITS,
    431: RefusalReason.LIMITS,
}


def refusal_reason(status: int) -> RefusalReason:
    """401 authentication; 408 timeouts; 413, 429, 431 limits; any other refusal (403, 400) policy."""
    return _BY_STATUS.get(status, RefusalReason.POLICY)


def count(metrics: Metrics, status: int, endpoint: str | None) -> None:
    metrics.refusals.labels(refusal_reason(status), endpoint or NOT_A_DOOR).inc()


class CountingState(Protocol):
    """What counting a refusal reads of the app's state (server/state.py AppState, a room above)."""

    metrics: Metrics


def count_refusal(scope: Scope, error: FaithproxyError) -> None:
    """Counts `error`, answered to the request of `scope`, in its app's metrics (none before the lifespan)."""
    state: CountingState | None = getattr(getattr(scope.get("app"), "state", None), "faithproxy", None)
    if state is None:
        return
    door = door_at(scope) if scope.get("type") == "http" else None
    count(state.metrics, error.status_code, door.path if door is not None else None)
