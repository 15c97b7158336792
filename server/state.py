"""Process-wide resources, built in the lifespan and handed to handlers as a dependency."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Protocol

from fastapi import Depends, Request

from faithproxy.clients.image_fetch import ImageFetcher
from faithproxy.clients.vllm import VLLMClient
from faithproxy.detectors.base import Detector
from faithproxy.regenerators.base import Regenerator
from faithproxy.server.observe.metrics import Metrics
from faithproxy.server.observe.reports import Reports
from faithproxy.server.observe.traces import TraceWriter
from faithproxy.server.protocol.doors import DoorTable
from faithproxy.server.settings import Settings

if TYPE_CHECKING:
    from faithproxy.clients.hidden_states import HiddenStatesClient
    from faithproxy.clients.judge_base import JudgeBackend
    from faithproxy.server.admission.admit import Admitted
    from faithproxy.server.admission.key_policy import KeyPolicies


class Capture(Protocol):
    """The bytes a sampled off response sent, kept by off mode (server/doors/off.py) for its shadow check."""

    @property
    def overflow(self) -> bool: ...  # past its size limit: abandoned, nothing kept
    def add(self, data: bytes) -> None: ...
    def data(self) -> bytes: ...


class ShadowSampler(Protocol):
    """What off mode hands a sampled request to: server/shadow/checker.py's ShadowChecker, in a room above
    this one (it reads this state), built in the lifespan."""

    def capture_for(self, admitted: Admitted) -> Capture | None: ...  # None: nothing a check could read
    def submit(self, admitted: Admitted, capture: Capture | None, *, complete: bool) -> None: ...
    async def aclose(self) -> None: ...


@dataclass
class AppState:
    settings: Settings
    generator: VLLMClient
    # The built detectors by name; a server that verifies nothing at start builds them (and the
    # regenerator) at the first request that needs them (server/app.py).
    detectors: Mapping[str, Detector]
    judges: list[str]
    regenerator: Regenerator
    metrics: Metrics
    tracer: TraceWriter
    known_models: set[str] = field(default_factory=set)
    # Fetches http(s) images under the SSRF policy: every request's when settings.image_urls is "fetch",
    # and, when URLs pass through, those of judges with fetch_images. None when neither needs it.
    image_fetcher: ImageFetcher | None = None
    # Set when settings.record_features: reads the features of steps checked by any detector, for traces.
    hidden_states: HiddenStatesClient | None = None
    # The judge backend that writes hints (settings.hint_judge), shared with the judge detector.
    hint_llm: JudgeBackend | None = None
    # Reports of finished verified requests, by request id (GET /v1/faithfulness/{request_id}).
    reports: Reports | None = None
    doors: DoorTable = field(default_factory=lambda: DoorTable(()))  # create_app's (server/doors/table.py)
    # The policy per API key in force (FAITHPROXY_POLICY_FILE); None without a policy file.
    key_policies: KeyPolicies | None = None
    # Checks sampled off requests after the fact (server/shadow/checker.py's ShadowChecker); None: no sampling.
    shadow: ShadowSampler | None = None

    def judge_fetches_images(self, judge: str | None) -> bool:
        return self.image_fetcher is not None and any(c.name == judge and c.fetch_images for c in self.settings.judges)

    def model_label(self, model: str) -> str:
        """Metric label for a model: only names the upstream lists, so labels stay a small set."""
        return model if model in self.known_models else "other"

    def learn_models(self, models: list[str]) -> None:
        new = set(models) - self.known_models
        if new:
            self.known_models |= new
            for model in new:
                self.metrics.preinit_model(model)  # for the detectors built so far


async def get_state(request: Request) -> AppState:  # async: FastAPI runs a sync dependency in a thread
    return request.app.state.faithproxy


StateDep = Annotated[AppState, Depends(get_state)]
