"""What detect mode and the shadow check share: the machine's rules for a request, and `verify`, the one
detector call that answers the machine's Check.

A ChainSession (session.py) calls `verify` for every Check of correct and detect mode; the shadow check
(server/shadow/checker.py) calls it for every Check of the recorded round it replays into detect mode's
machine. So a step is checked, counted and timed the same way whether the client waits for it or not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from faithproxy.detectors.base import Detector
from faithproxy.detectors.features import read_step_features
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.correction import Check, Checked, Rules
from faithproxy.faithcore.errors import DetectorError
from faithproxy.faithcore.reasoning_formats import ReasoningFormat, get_format
from faithproxy.server.admission.policy import RequestPolicy
from faithproxy.server.observe.metrics import Metrics, detector_error_label
from faithproxy.server.settings import Settings

if TYPE_CHECKING:
    from faithproxy.clients.hidden_states import HiddenStatesClient


def reasoning_format_of(
    settings: Settings, policy: RequestPolicy, adapt: Callable[[ReasoningFormat], ReasoningFormat]
) -> ReasoningFormat:
    """Where the model writes its thinking: the request's header, else the server's setting, as the
    door's rounds see it (`adapt`: a RoundWire's `reasoning_format`)."""
    name = policy.reasoning_format or settings.reasoning_format
    return adapt(get_format(name, settings.think_open_tag, settings.think_close_tag))


def chain_rules(
    settings: Settings,
    policy: RequestPolicy,
    detector: Detector,
    body: dict[str, Any],
    reasoning_format: ReasoningFormat,
) -> Rules:
    """The machine's rules for a request, from its policy, the settings, the detector and its body."""
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    return Rules(
        mode="detect" if policy.mode == "detect" else "correct",
        detector=policy.detector,
        max_retries=policy.max_retries,
        max_regenerations=settings.max_regenerations_per_request,
        max_batch_steps=settings.max_batch_steps,
        on_detector_error=policy.on_detector_error,
        detector_gives_verdicts=detector.gives_verdicts,
        detector_types_steps=detector.types_steps,
        gate_without_perception=not settings.judge_every_step,
        completion_budget=limit if isinstance(limit, int) else None,
        reasoning_format=reasoning_format,
        sequential=settings.sequential_checks,
        resume_attempts=settings.upstream_resume_attempts,
    )


async def verify(
    check: Check,
    view: RequestView,
    detector: Detector,
    *,
    name: str,
    metrics: Metrics,
    hidden_states: HiddenStatesClient | None = None,
    timed: Callable[[float], None] | None = None,
) -> Checked:
    """The detector's verdicts on `check.steps`, with `view` holding the check's accepted steps (and marked
    a rewrite when the machine checks a candidate). A DetectorError is the result (counted by reason under
    the detector's `name`; the machine judges it under on-detector-error). Each call's latency and batch
    size are counted, and handed to `timed` when given. With `hidden_states`, the trace's features are
    read beside the call, unless the detector reads its own or the steps are a rewrite."""
    view = view.with_accepted(check.accepted)
    if check.candidate:
        view = dataclasses.replace(view, rewrite=True)
    call = _call(detector, view, check, name, metrics, timed)
    if hidden_states is None or detector.reads_hidden_states or check.candidate:
        return await call
    checked, features = await asyncio.gather(call, read_step_features(hidden_states, view, check.steps))
    return Checked(checked.verdicts, checked.error, checked.usage, features)


async def _call(
    detector: Detector,
    view: RequestView,
    check: Check,
    name: str,
    metrics: Metrics,
    timed: Callable[[float], None] | None,
) -> Checked:
    started = time.perf_counter()
    try:
        result = await detector.check(view, check.steps)
        if len(result.verdicts) != len(check.steps):
            got, asked = len(result.verdicts), len(check.steps)
            raise DetectorError(f"detector {name} returned {got} verdicts for {asked} steps")
        return Checked(list(result.verdicts), usage=result.usage, features=result.features)
    except DetectorError as exc:
        metrics.detector_errors.labels(name, detector_error_label(exc)).inc()
        return Checked(error=exc)
    finally:
        elapsed = time.perf_counter() - started
        if timed is not None:
            timed(elapsed)
        metrics.detector_latency.labels(name).observe(elapsed)
        metrics.detector_batch.labels(name).observe(len(check.steps))
