"""Per-request policy from `X-Faithproxy-*` headers, validated, with defaults from Settings.

An invalid value is a PolicyError naming the header (HTTP 400 in OpenAI format); it is raised before
anything is sent upstream.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from faithproxy.detectors.judge import BUDGET_OPTION
from faithproxy.detectors.registry import DETECTORS
from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.reasoning_formats import FORMATS
from faithproxy.server.settings import Mode, OnDetectorError, Settings

HEADER_MODE = "x-faithproxy-mode"
HEADER_DETECTOR = "x-faithproxy-detector"
HEADER_MAX_RETRIES = "x-faithproxy-max-retries"
HEADER_JUDGE = "x-faithproxy-judge"
HEADER_ON_DETECTOR_ERROR = "x-faithproxy-on-detector-error"
HEADER_ANNOTATE = "x-faithproxy-annotate"
HEADER_PROBE_THRESHOLD = "x-faithproxy-probe-threshold"
HEADER_CASCADE_LOW = "x-faithproxy-cascade-low"
HEADER_CASCADE_HIGH = "x-faithproxy-cascade-high"
HEADER_HINTS = "x-faithproxy-hints"
# Judge tokens this request may spend (settings.judge_budget_tokens; a request may lower it, not raise it).
HEADER_JUDGE_BUDGET = "x-faithproxy-judge-budget"
_MAX_BUDGET = 10**12
# The served model's reasoning format, for a proxy whose upstream serves models of several formats
# (settings.reasoning_format otherwise): which markers bound steps, how a chain is continued.
HEADER_REASONING_FORMAT = "x-faithproxy-reasoning-format"

_MODES = ("correct", "detect", "off")
_ON_ERROR = ("pass", "fail")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class RequestPolicy:
    mode: Mode
    detector: str
    max_retries: int
    judge: str | None
    on_detector_error: OnDetectorError
    annotate: bool
    probe_threshold: float | None = None  # None: the probe file's threshold
    cascade_low: float | None = None  # None: the server's settings
    cascade_high: float | None = None
    hints: bool = False  # collaborative hint inference before generation (server/hints.py)
    reasoning_format: str | None = None  # None: the server's settings
    judge_budget_tokens: int | None = None  # None: no limit

    def detector_options(self) -> dict[str, float]:
        """The per-request detector settings that were given (ChainContext.options)."""
        options = {"probe_threshold": self.probe_threshold, "cascade_low": self.cascade_low}
        options["cascade_high"] = self.cascade_high
        options[BUDGET_OPTION] = self.judge_budget_tokens
        return {k: v for k, v in options.items() if v is not None}


def _choice(header: str, value: str, allowed: Collection[str]) -> str:
    value = value.strip().lower()
    if value not in allowed:
        hint = difflib.get_close_matches(value, list(allowed), n=1)
        did_you_mean = f" Did you mean '{hint[0]}'?" if hint else ""
        raise PolicyError(
            f"Invalid value for header {header}: '{value}'. Allowed: {', '.join(sorted(allowed))}.{did_you_mean}",
            param=header,
            code="invalid_header",
        )
    return value


def _probability(headers: Mapping[str, str], header: str) -> float | None:
    raw = headers.get(header)
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise PolicyError(
            f"Invalid value for header {header}: '{raw}'. Expected a probability from 0 to 1.",
            param=header,
            code="invalid_header",
        )
    return value


def _judge_budget(headers: Mapping[str, str], settings: Settings) -> int | None:
    """The request's judge budget: the server's, or a lower one from the header."""
    limit = settings.judge_budget_tokens
    raw = headers.get(HEADER_JUDGE_BUDGET)
    if raw is None:
        return limit
    value = raw.strip()
    if not value.isascii() or not value.isdigit() or int(value) > _MAX_BUDGET:
        raise PolicyError(
            f"Invalid value for header {HEADER_JUDGE_BUDGET}: '{raw}'. Expected a whole number of judge tokens "
            "(0 or more; 0 checks nothing with the judge).",
            param=HEADER_JUDGE_BUDGET,
            code="invalid_header",
        )
    if limit is not None and int(value) > limit:
        raise PolicyError(
            f"Header {HEADER_JUDGE_BUDGET} asks for {int(value)} judge tokens, more than this server allows a "
            f"request ({limit}).",
            param=HEADER_JUDGE_BUDGET,
            code="invalid_header",
        )
    return int(value)


def _uses_judge(detector: str) -> bool:
    """Whether the registered detector calls a judge (a name the registry lacks is refused elsewhere)."""
    return detector in DETECTORS and DETECTORS.resolve(detector).uses_judge


def policy_from_headers(
    headers: Mapping[str, str],
    settings: Settings,
    *,
    detectors: Collection[str],
    judges: Collection[str],
    hints_available: bool = False,
) -> RequestPolicy:
    """`detectors` and `judges` are the names this server can actually serve; `hints_available`: a hint
    judge is configured."""
    mode = settings.default_mode
    if (raw := headers.get(HEADER_MODE)) is not None:
        mode = _choice(HEADER_MODE, raw, _MODES)  # type: ignore[assignment]

    detector = settings.default_detector
    if (raw := headers.get(HEADER_DETECTOR)) is not None:
        detector = _choice(HEADER_DETECTOR, raw, detectors)

    max_retries = settings.max_retries
    if (raw := headers.get(HEADER_MAX_RETRIES)) is not None:
        try:
            max_retries = int(raw.strip())
        except ValueError:
            max_retries = -1
        if not 0 <= max_retries <= 10:
            raise PolicyError(
                f"Invalid value for header {HEADER_MAX_RETRIES}: '{raw}'. Expected an integer from 0 to 10.",
                param=HEADER_MAX_RETRIES,
                code="invalid_header",
            )

    judge = settings.default_judge or (next(iter(judges)) if judges else None)
    if (raw := headers.get(HEADER_JUDGE)) is not None:
        if not judges:
            raise PolicyError(
                f"Header {HEADER_JUDGE} names a judge, but this server has no judges configured.",
                param=HEADER_JUDGE,
                code="invalid_header",
            )
        judge = _choice(HEADER_JUDGE, raw, judges)

    on_error = settings.on_detector_error
    if (raw := headers.get(HEADER_ON_DETECTOR_ERROR)) is not None:
        on_error = _choice(HEADER_ON_DETECTOR_ERROR, raw, _ON_ERROR)  # type: ignore[assignment]

    annotate = settings.annotate
    if (raw := headers.get(HEADER_ANNOTATE)) is not None:
        value = _choice(HEADER_ANNOTATE, raw, _TRUE + _FALSE)
        annotate = value in _TRUE

    probe_threshold = _probability(headers, HEADER_PROBE_THRESHOLD)
    low = _probability(headers, HEADER_CASCADE_LOW)
    high = _probability(headers, HEADER_CASCADE_HIGH)
    if (low if low is not None else settings.cascade_low) > (high if high is not None else settings.cascade_high):
        raise PolicyError(
            f"Header {HEADER_CASCADE_LOW} must not exceed {HEADER_CASCADE_HIGH} "
            f"(low {low if low is not None else settings.cascade_low}, "
            f"high {high if high is not None else settings.cascade_high}).",
            param=HEADER_CASCADE_LOW if low is not None else HEADER_CASCADE_HIGH,
            code="invalid_header",
        )

    hints = settings.hints_default and hints_available and mode != "off"
    if (raw := headers.get(HEADER_HINTS)) is not None:
        hints = _choice(HEADER_HINTS, raw, _TRUE + _FALSE) in _TRUE
        if hints and not hints_available:
            raise PolicyError(
                f"Header {HEADER_HINTS} asks for hints, but this server has no hint judge configured "
                "(set FAITHPROXY_HINT_JUDGE to the name of one of FAITHPROXY_JUDGES).",
                param=HEADER_HINTS,
                code="invalid_header",
            )
        if hints and mode == "off":
            raise PolicyError(
                f"Header {HEADER_HINTS} cannot be used with X-Faithproxy-Mode: off (off passes the request "
                "through unchanged).",
                param=HEADER_HINTS,
                code="invalid_header",
            )

    judge_budget = _judge_budget(headers, settings)

    reasoning_format = None
    if (raw := headers.get(HEADER_REASONING_FORMAT)) is not None:
        reasoning_format = _choice(HEADER_REASONING_FORMAT, raw, FORMATS)

    if mode != "off" and judge is None and _uses_judge(detector):
        raise PolicyError(
            f"The {detector} detector was requested but this server has no judges configured "
            f"(set FAITHPROXY_JUDGES, or choose another detector with {HEADER_DETECTOR}).",
            param=HEADER_DETECTOR,
            code="invalid_header",
        )
    return RequestPolicy(
        mode=mode,
        detector=detector,
        max_retries=max_retries,
        judge=judge,
        on_detector_error=on_error,
        annotate=annotate,
        probe_threshold=probe_threshold,
        cascade_low=low,
        cascade_high=high,
        hints=hints,
        reasoning_format=reasoning_format,
        judge_budget_tokens=judge_budget,
    )
