"""Per-request policy from headers: defaults, valid values, and 400s that name the header."""

import pytest

from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.admission.policy import RequestPolicy, policy_from_headers
from faithproxy.server.settings import Settings

DETECTORS = ["judge", "prompt", "none"]
JUDGES = ["claude", "qwen"]


def policy(headers: dict[str, str], **settings: object):
    return policy_from_headers(headers, Settings(**settings), detectors=DETECTORS, judges=JUDGES)


def test_defaults_come_from_settings() -> None:
    p = policy({}, default_mode="detect", max_retries=2, default_judge="qwen")
    assert (p.mode, p.detector, p.max_retries, p.judge, p.on_detector_error, p.annotate) == (
        "detect",
        "judge",
        2,
        "qwen",
        "pass",
        True,
    )


def test_headers_override_defaults() -> None:
    p = policy(
        {
            "x-faithproxy-mode": "OFF",
            "x-faithproxy-detector": "prompt",
            "x-faithproxy-max-retries": "0",
            "x-faithproxy-judge": "claude",
            "x-faithproxy-on-detector-error": "fail",
            "x-faithproxy-annotate": "false",
        }
    )
    assert (p.mode, p.detector, p.max_retries, p.judge, p.on_detector_error, p.annotate) == (
        "off",
        "prompt",
        0,
        "claude",
        "fail",
        False,
    )


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-faithproxy-mode", "fix"),
        ("x-faithproxy-detector", "judgee"),
        ("x-faithproxy-detector", "probe"),  # not served by this server
        ("x-faithproxy-max-retries", "11"),
        ("x-faithproxy-max-retries", "-1"),
        ("x-faithproxy-max-retries", "three"),
        ("x-faithproxy-judge", "http://evil.example/v1"),
        ("x-faithproxy-on-detector-error", "ignore"),
        ("x-faithproxy-annotate", "maybe"),
    ],
)
def test_invalid_values_name_the_header(header: str, value: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy({header: value})
    assert info.value.param == header
    assert header in info.value.message
    assert info.value.status_code == 400


def test_did_you_mean() -> None:
    with pytest.raises(PolicyError, match="Did you mean 'judge'"):
        policy({"x-faithproxy-detector": "judgee"})


def test_judge_detector_without_configured_judges_is_refused() -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_headers({}, Settings(), detectors=["prompt", "none"], judges=[])
    assert info.value.param == "x-faithproxy-detector"


def test_probe_and_cascade_thresholds_from_headers() -> None:
    p = policy({
        "x-faithproxy-probe-threshold": "0.7", "x-faithproxy-cascade-low": "0.05", "x-faithproxy-cascade-high": "0.95",
    })  # fmt: skip
    options = p.detector_options()
    assert (options["probe_threshold"], options["cascade_low"], options["cascade_high"]) == (0.7, 0.05, 0.95)
    assert p.detector_options() == {"probe_threshold": 0.7, "cascade_low": 0.05, "cascade_high": 0.95}
    assert policy({}).detector_options() == {}  # the probe file's threshold and the server's cascade settings


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"x-faithproxy-probe-threshold": "1.5"}, "x-faithproxy-probe-threshold"),
        ({"x-faithproxy-probe-threshold": "nan"}, "x-faithproxy-probe-threshold"),
        ({"x-faithproxy-cascade-low": "high"}, "x-faithproxy-cascade-low"),
        ({"x-faithproxy-cascade-low": "0.8", "x-faithproxy-cascade-high": "0.2"}, "x-faithproxy-cascade-low"),
        ({"x-faithproxy-cascade-high": "0.05"}, "x-faithproxy-cascade-high"),  # below the server's low (0.1)
        ({"x-faithproxy-cascade-rewrites": "probe"}, "x-faithproxy-cascade-rewrites"),
    ],
)
def test_bad_thresholds_are_400s_naming_the_header(headers: dict[str, str], named: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy(headers)
    assert info.value.status_code == 400 and info.value.param == named


def test_hints_header_and_default() -> None:
    def hints(headers: dict[str, str], available: bool = True, **settings: object) -> bool:
        return policy_from_headers(
            headers, Settings(**settings), detectors=DETECTORS, judges=JUDGES, hints_available=available
        ).hints

    assert hints({}) is False
    assert hints({"x-faithproxy-hints": "on"}) is True
    assert hints({}, hints_default=True) is True
    assert hints({"x-faithproxy-hints": "off"}, hints_default=True) is False
    assert hints({}, available=False, hints_default=True) is False  # no hint judge: the default cannot apply
    assert hints({"x-faithproxy-mode": "off"}, hints_default=True) is False  # off passes requests through
    for headers, available in (
        ({"x-faithproxy-hints": "on"}, False),
        ({"x-faithproxy-hints": "on", "x-faithproxy-mode": "off"}, True),
        ({"x-faithproxy-hints": "maybe"}, True),
    ):
        with pytest.raises(PolicyError) as info:
            hints(headers, available)
        assert info.value.param == "x-faithproxy-hints"


@pytest.mark.parametrize("detector", ["judge", "cascade"])
def test_any_detector_that_uses_a_judge_is_refused_without_judges(detector: str) -> None:
    """Asked of the detector's declared `uses_judge`, not of its name."""
    with pytest.raises(PolicyError) as info:
        policy_from_headers({}, Settings(default_detector=detector), detectors=["prompt", "none"], judges=[])
    assert info.value.param == "x-faithproxy-detector" and f"The {detector} detector" in info.value.message
    off = policy_from_headers(
        {"x-faithproxy-mode": "off"}, Settings(default_detector=detector), detectors=["none"], judges=[]
    )
    assert off.mode == "off"  # off mode runs no detector: nothing to refuse


def test_judge_budget_from_settings_and_header() -> None:
    def budget(p: RequestPolicy) -> int | None:
        return p.detector_options().get("judge_budget_tokens")

    assert budget(policy({})) is None
    assert "judge_budget_tokens" not in policy({}).detector_options()
    assert budget(policy({}, judge_budget_tokens=5000)) == 5000
    lowered = policy({"x-faithproxy-judge-budget": " 1200 "}, judge_budget_tokens=5000)
    assert budget(lowered) == 1200 and lowered.detector_options()["judge_budget_tokens"] == 1200
    assert budget(policy({"x-faithproxy-judge-budget": "0"})) == 0  # no judge call at all
    assert budget(policy({"x-faithproxy-judge-budget": "999999"})) == 999999  # the server sets none


@pytest.mark.parametrize("value", ["-1", "1.5", "", "lots", "1e3", "١٢", "10000000000000"])
def test_bad_judge_budgets_are_400s_naming_the_header(value: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy({"x-faithproxy-judge-budget": value})
    assert info.value.status_code == 400 and info.value.param == "x-faithproxy-judge-budget"


def test_a_request_cannot_raise_the_server_judge_budget() -> None:
    with pytest.raises(PolicyError, match="more than this server allows") as info:
        policy({"x-faithproxy-judge-budget": "5001"}, judge_budget_tokens=5000)
    assert info.value.param == "x-faithproxy-judge-budget"
