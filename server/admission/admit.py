"""Admission: the one path from a request's bytes and headers to a request the proxy will serve.

Every door and every mode goes through `admit`: each door's route (server/doors/routes.py) and the
off-mode fast path (server/doors/off.py, pure ASGI) alike, so a body, a limit or a header is refused
the same way whichever of them meets it. What differs between doors is only how a body is read: each
door brings its `parse` (server/protocol/doors.py; each door's module of server/doors/ holds it) and,
for the doors that run as chat in a verified mode or refuse there what off mode passes, its `translate`.

    raw bytes ── parse (per door) ── check_body ── policy_from_headers ── key policy ── settle_media_urls
              ── translate (per door, verified modes) ─▶ Admitted           (async: may fetch)

Everything but the media-URL step is synchronous and cheap: off mode exists for CPU per token
(benchmarks/performance/cpu_per_token.py), and its admission is most of its per-request work. A refusal
is a FaithproxyError raised before anything is sent upstream; the door answers it and counts it with
`count_refused`, the one place refused requests are counted. The key policy step
(server/admission/key_policy.py, with FAITHPROXY_POLICY_FILE) refuses with a 403 what the API key's policy does not
allow, so every door inherits it.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from faithproxy.clients.vllm import CHAT_PATH
from faithproxy.faithcore.errors import FaithproxyError, PolicyError
from faithproxy.server.admission import refusals
from faithproxy.server.admission.image_urls import settle_media_urls
from faithproxy.server.admission.limits import check_body
from faithproxy.server.admission.policy import RequestPolicy, policy_from_headers

if TYPE_CHECKING:  # this module stays light for the off-mode path: no FastAPI, no policy file's YAML
    from faithproxy.clients.image_fetch import ImageFetcher
    from faithproxy.server.admission.key_policy import KeyPolicies
    from faithproxy.server.observe.metrics import Metrics
    from faithproxy.server.protocol.doors import Door
    from faithproxy.server.settings import Settings


class AdmissionState(Protocol):
    """What admission reads of the app's resources (server/state.py's AppState, a room above this one,
    which is built in the lifespan and satisfies this)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def detectors(self) -> Mapping[str, object]: ...  # the detectors this server can serve, by name
    @property
    def judges(self) -> list[str]: ...
    @property
    def hint_llm(self) -> object | None: ...  # the hint judge's backend; None: no hints here
    @property
    def key_policies(self) -> KeyPolicies | None: ...
    @property
    def image_fetcher(self) -> ImageFetcher | None: ...


@dataclass(slots=True)
class Admitted:
    """A request admitted for serving: what every door hands to its serving object."""

    body: dict[str, Any]
    raw: bytes  # what goes upstream: the client's bytes, or the body re-encoded when admission changed it
    policy: RequestPolicy
    request_id: str
    started: float  # time.perf_counter() when the request arrived: durations and TTFT count from here
    started_wall: float  # time.time() at the same moment: the trace's time, the response's `created`
    key_policy: str = "default"  # the name of the API key's policy (server/admission/key_policy.py), never the key
    endpoint: str = CHAT_PATH  # the door's path: the `endpoint` label of its metrics
    # The client's body as its door's API has it, where `body` is its translation to chat (the Responses
    # and Messages doors in a verified mode); else `body` itself.
    request: dict[str, Any] | None = None
    shadow: bool = False  # an off-mode request sampled to be checked after the fact (server/shadow/checker.py)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


# The ids admission made in this request's context: server/runtime/internal_errors.py sets a list here around
# each request and names the id in the log and the answer when the request fails unexpectedly.
REQUEST_ID: ContextVar[list[str] | None] = ContextVar("faithproxy_request_id", default=None)


def new_request_id() -> str:
    """24 hex digits: the X-Faithproxy-Request-Id of a response, its trace and its report."""
    return os.urandom(12).hex()


def _noted(request_id: str) -> str:
    ids = REQUEST_ID.get()
    if ids is not None:
        ids.append(request_id)
    return request_id


def arrival() -> tuple[float, float]:
    """(perf_counter, wall clock) now: taken by a door before it reads the body."""
    return time.perf_counter(), time.time()


async def admit(
    raw: bytes, headers: Mapping[str, str], state: AdmissionState, door: Door, *, started: tuple[float, float]
) -> Admitted:
    """The request as it will be served, or a FaithproxyError (PolicyError and its kinds, 4xx) raised
    before anything is sent upstream. `started` is `arrival()` taken when the request came in. A door
    that speaks another API than chat (`door.translate`) has its body turned into the chat body here, in
    a verified mode, once the limits and the media-URL policy have run on the client's body (their errors
    name the client's fields): they run once, whichever door."""
    request = door.parse(raw)
    changed = check_body(request, state.settings)  # True: the max_tokens cap was added
    policy = policy_from_headers(
        headers,
        state.settings,
        detectors=state.detectors,
        judges=state.judges,
        hints_available=state.hint_llm is not None,
    )
    key_policy = "default"
    share = state.settings.shadow_share
    if state.key_policies is not None:  # 403 for what the API key's policy does not allow
        limits, policy = state.key_policies.admit(headers, policy)
        key_policy = limits.name
        share = limits.shadow_share if limits.shadow_share is not None else share
    # Every mode: no client-chosen media URL reaches vLLM unchecked (ImageRefused: nothing sent yet).
    changed |= await settle_media_urls(request, state.settings.image_urls, state.image_fetcher)
    if changed:
        raw = json.dumps(request).encode()  # forward the body as settled
    body = request
    if door.translate is not None and policy.mode != "off":
        # after the limits and the media-URL policy: the chat body carries the images they settled
        body = door.translate(request, policy.mode)  # a PolicyError for what a verified chain can't carry
    return Admitted(
        body,
        raw,
        policy,
        _noted(new_request_id()),
        *started,
        key_policy=key_policy,
        endpoint=door.path,
        request=request,
        # sampled for a shadow check (server/shadow/checker.py): an off request, at its key's share
        shadow=policy.mode == "off" and share > 0.0 and random.random() < share,
    )


def count_refused(metrics: Metrics, exc: FaithproxyError, endpoint: str) -> None:
    """Counts a request to the door at `endpoint` answered with `exc` before it reached a mode (no mode,
    no detector yet), and the refusal by reason (server/admission/refusals.py)."""
    label = "rejected" if isinstance(exc, PolicyError) else "unknown"
    metrics.requests.labels(label, "-", f"{exc.status_code // 100}xx", endpoint).inc()
    refusals.count(metrics, exc.status_code, endpoint)
