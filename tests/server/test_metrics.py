"""Error codes and metric labels come from one enum per family: every code is a pre-initialised label."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from faithproxy.detectors import cascade
from faithproxy.faithcore.context import JudgeUsage
from faithproxy.faithcore.errors import (
    DetectorError,
    DetectorErrorCode,
    UpstreamError,
    UpstreamErrorCode,
    UpstreamStatusError,
)
from faithproxy.server.observe.metrics import (
    CASCADE_STAGES,
    DETECTOR_ERRORS,
    JUDGE_TOKEN_KINDS,
    UPSTREAM_ERRORS,
    Metrics,
    detector_error_label,
    upstream_error_label,
)
from faithproxy.server.protocol.errors import error_body, error_frame


def fresh(detectors: list[str]) -> CollectorRegistry:
    registry = CollectorRegistry()
    Metrics(registry, detectors)
    return registry


@pytest.mark.parametrize("code", list(DetectorErrorCode))
def test_every_detector_error_code_is_a_preinitialised_label(code: DetectorErrorCode) -> None:
    registry = fresh(["judge", "probe"])
    for detector in ("judge", "probe"):
        labels = {"detector": detector, "reason": code.value}
        assert registry.get_sample_value("faithproxy_detector_errors_total", labels) == 0.0
    assert detector_error_label(DetectorError("x", code=code)) == code.value


@pytest.mark.parametrize("code", list(UpstreamErrorCode))
def test_every_upstream_error_code_is_a_preinitialised_label(code: UpstreamErrorCode) -> None:
    assert fresh([]).get_sample_value("faithproxy_upstream_errors_total", {"reason": code.value}) == 0.0
    assert upstream_error_label(UpstreamError("x", code=code)) == code.value


def test_label_sets_are_the_enums_and_keep_the_labels_dashboards_know() -> None:
    assert set(DETECTOR_ERRORS) == {code.value for code in DetectorErrorCode}
    assert set(UPSTREAM_ERRORS) == {code.value for code in UpstreamErrorCode}
    # the labels counted before the enums (dashboards and alert rules may name any of them)
    assert {"timeout", "connection", "status_429", "status_5xx", "status_4xx", "unparseable", "other"} <= set(
        DETECTOR_ERRORS
    )
    assert {"bad_response", "empty_reply", "sdk_error"} <= set(DETECTOR_ERRORS)  # no longer folded into "other"
    assert {"connect", "status", "stream_broken", "stream_truncated", "stalled", "malformed", "stream_error",
            "other"} <= set(UPSTREAM_ERRORS)  # fmt: skip


def test_cascade_stages_come_from_the_cascade_and_are_preinitialised() -> None:
    assert CASCADE_STAGES == cascade.STAGES == cascade.CascadeDetector.decision_stages  # declared by the cascade
    registry = fresh([])
    for stage in cascade.STAGES:
        assert registry.get_sample_value("faithproxy_cascade_decisions_total", {"stage": stage}) == 0.0


def test_errors_without_a_known_code_are_counted_as_other_or_status() -> None:
    assert detector_error_label(DetectorError("verdict count mismatch")) == "other"
    assert detector_error_label(RuntimeError("a bug")) == "other"
    assert upstream_error_label(UpstreamStatusError("vLLM said 400", status_code=400)) == "status"
    assert upstream_error_label(UpstreamError("no code")) == "other"


def test_error_classes_refuse_codes_outside_their_enum() -> None:
    with pytest.raises(ValueError):
        DetectorError("judge failed", code="status_401")
    with pytest.raises(ValueError):
        UpstreamError("vLLM failed", code="timeout")  # a detector reason, not an upstream one
    assert DetectorError("x", code="timeout").code is DetectorErrorCode.TIMEOUT  # strings of members are taken


def test_error_bodies_carry_the_plain_code_strings() -> None:
    body = error_body(DetectorError("judge down", code=DetectorErrorCode.TIMEOUT))
    wire = json.loads(json.dumps(body))
    assert wire == {"error": {"message": "judge down", "type": "detector_error", "param": None, "code": "timeout"}}
    assert b'"code": "stalled"' in error_frame(UpstreamError("idle", code=UpstreamErrorCode.STALLED))
    assert error_body(DetectorError("no code"))["error"]["code"] is None  # as before: null, not "other"


def test_judge_bill_series_are_preinitialised_per_judge_and_count_each_call() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, ["judge"], judges=["claude", "qwen"])
    for judge in ("claude", "qwen"):
        assert registry.get_sample_value("faithproxy_judge_calls_total", {"judge": judge}) == 0.0
        for kind in ("input", "cached_input", "cache_creation", "output"):
            labels = {"judge": judge, "kind": kind, "policy": "default"}
            assert registry.get_sample_value("faithproxy_judge_tokens_total", labels) == 0.0
    call = JudgeUsage(calls=1, input_tokens=40, cached_input_tokens=1200, cache_creation_tokens=30, output_tokens=9)
    metrics.count_judge_call("claude", call)
    metrics.count_judge_call("claude", call)
    assert registry.get_sample_value("faithproxy_judge_calls_total", {"judge": "claude"}) == 2.0
    expected = {"input": 80.0, "cached_input": 2400.0, "cache_creation": 60.0, "output": 18.0}
    for kind, value in expected.items():
        labels = {"judge": "claude", "kind": kind, "policy": "default"}
        assert registry.get_sample_value("faithproxy_judge_tokens_total", labels) == value
    assert set(JUDGE_TOKEN_KINDS.values()) == {"input_tokens", "cached_input_tokens", "cache_creation_tokens",
                                               "output_tokens"}  # fmt: skip


def test_budget_is_an_unchecked_reason_label() -> None:
    registry = CollectorRegistry()
    Metrics(registry, ["judge"]).preinit_model("m", ["judge"])
    labels = {"detector": "judge", "model": "m", "reason": "budget"}
    assert registry.get_sample_value("faithproxy_unchecked_steps_total", labels) == 0.0
