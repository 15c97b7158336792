"""Per-request policy from `X-Faithproxy-*` headers, validated, with defaults from Settings.

An invalid value is a PolicyError naming the header (HTTP 400 in OpenAI format); it is raised before
anything is sent upstream.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from faithproxy.detectors.registry import DETECTORS, DetectorOption, declared_options
from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.reasoning_formats import FORMATS
from faithproxy.server.settings import Mode, OnDetectorError, Settings

HEADER_MODE = "x-faithproxy-mode"
HEADER_DETECTOR = "x-faithproxy-detector"
HEADER_MAX_RETRIES = "x-faithproxy-max-retries"
HEADER_JUDGE = "x-faithproxy-judge"
HEADER_ON_DETECTOR_ERROR = "x-faithproxy-on-detector-error"
HEADER_ANNOTATE = "x-faithproxy-annotate"
HEADER_HINTS = "x-faithproxy-hints"
# The served model's reasoning format, for a proxy whose upstream serves models of several formats
# (settings.reasoning_format otherwise): which markers bound steps, how a chain is continued.
HEADER_REASONING_FORMAT = "x-faithproxy-reasoning-format"
# The detectors' own headers (probe threshold, cascade thresholds, judge budget) are declared on their
# classes (`Detector.options`) and read from the registry: `detector_headers()`.

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
    hints: bool = False  # collaborative hint inference before generation (server/chain/hints.py)
    reasoning_format: str | None = None  # None: the server's settings
    # The detector options this request has (`DetectorOption.key` → value): those its headers gave, and
    # the server's values of options that default to a setting (the judge budget). Absent: the detector's
    # own default (the probe file's threshold, the server's cascade thresholds).
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def detector_options(self) -> dict[str, Any]:
        """The per-request detector settings that were given (RequestView.options)."""
        return dict(self.options)


@dataclass(frozen=True)
class Served:
    """What this server can serve: detector and judge names, and whether a hint judge is configured."""

    detectors: Collection[str]
    judges: Collection[str]
    hints_available: bool


@dataclass(frozen=True)
class HeaderRow:
    """One header of the table: the RequestPolicy field it sets, how its text is read (PolicyError when
    it is not valid: `parse(header, raw, served)`), the field's value when the header is absent, and a
    rule across fields to apply once it is read (`then(headers, values, served)`, values so far)."""

    header: str
    field: str
    parse: Callable[[str, str, Served], Any]
    default: Callable[[Settings, Served], Any]
    then: Callable[[Mapping[str, str], dict[str, Any], Served], None] | None = None


def _invalid(header: str, raw: str, expected: str) -> PolicyError:
    return PolicyError(
        f"Invalid value for header {header}: '{raw}'. Expected {expected}.", param=header, code="invalid_header"
    )


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


def _one_of(allowed: Collection[str]) -> Callable[[str, str, Served], str]:
    return lambda header, raw, _served: _choice(header, raw, allowed)


def _flag(header: str, raw: str, _served: Served) -> bool:
    return _choice(header, raw, _TRUE + _FALSE) in _TRUE


def _retries(header: str, raw: str, _served: Served) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= 10:
        raise _invalid(header, raw, "an integer from 0 to 10")
    return value


def _detector(header: str, raw: str, served: Served) -> str:
    return _choice(header, raw, served.detectors)


def _judge(header: str, raw: str, served: Served) -> str:
    if not served.judges:
        raise PolicyError(
            f"Header {header} names a judge, but this server has no judges configured.",
            param=header,
            code="invalid_header",
        )
    return _choice(header, raw, served.judges)


def _default_judge(settings: Settings, served: Served) -> str | None:
    return settings.default_judge or (next(iter(served.judges)) if served.judges else None)


def _hints_fit(headers: Mapping[str, str], values: dict[str, Any], served: Served) -> None:
    """Hints need a hint judge and a mode that generates; off mode never gets them by default."""
    if HEADER_HINTS not in headers:
        values["hints"] = values["hints"] and values["mode"] != "off"
        return
    if values["hints"] and not served.hints_available:
        raise PolicyError(
            f"Header {HEADER_HINTS} asks for hints, but this server has no hint judge configured "
            "(set FAITHPROXY_HINT_JUDGE to the name of one of FAITHPROXY_JUDGES).",
            param=HEADER_HINTS,
            code="invalid_header",
        )
    if values["hints"] and values["mode"] == "off":
        raise PolicyError(
            f"Header {HEADER_HINTS} cannot be used with X-Faithproxy-Mode: off (off passes the request "
            "through unchanged).",
            param=HEADER_HINTS,
            code="invalid_header",
        )


# The request's own headers, in the order they are read: with several invalid headers, the first one is
# the one reported. The detectors' options are read after the first `_BEFORE_DETECTOR_OPTIONS` rows, where
# they always were.
HEADERS: tuple[HeaderRow, ...] = (
    HeaderRow(HEADER_MODE, "mode", _one_of(_MODES), lambda settings, _: settings.default_mode),
    HeaderRow(HEADER_DETECTOR, "detector", _detector, lambda settings, _: settings.default_detector),
    HeaderRow(HEADER_MAX_RETRIES, "max_retries", _retries, lambda settings, _: settings.max_retries),
    HeaderRow(HEADER_JUDGE, "judge", _judge, _default_judge),
    HeaderRow(HEADER_ON_DETECTOR_ERROR, "on_detector_error", _one_of(_ON_ERROR), lambda s, _: s.on_detector_error),
    HeaderRow(HEADER_ANNOTATE, "annotate", _flag, lambda settings, _: settings.annotate),
    # the mode is read first: off mode never gets hints by default (`_hints_fit`)
    HeaderRow(
        HEADER_HINTS,
        "hints",
        _flag,
        lambda settings, served: settings.hints_default and served.hints_available,
        then=_hints_fit,
    ),
    HeaderRow(HEADER_REASONING_FORMAT, "reasoning_format", _one_of(FORMATS), lambda _settings, _served: None),
)
_BEFORE_DETECTOR_OPTIONS = 6


def _read(
    rows: tuple[HeaderRow, ...], headers: Mapping[str, str], settings: Settings, served: Served, values: dict[str, Any]
) -> None:
    """Sets the RequestPolicy fields of `rows` in `values`: each header's value, or its default when
    absent; each row's rule runs once it is read."""
    for row in rows:
        raw = headers.get(row.header)
        values[row.field] = row.default(settings, served) if raw is None else row.parse(row.header, raw, served)
        if row.then is not None:
            row.then(headers, values, served)


def detector_headers() -> tuple[str, ...]:
    """The headers the registered detectors declare (their per-request options)."""
    return tuple(option.header for option in declared_options())


def _detector_options(headers: Mapping[str, str], settings: Settings) -> dict[str, Any]:
    """Every registered detector's options that the headers give, or that default to a setting."""
    options: dict[str, Any] = {}
    for option in declared_options():
        raw = headers.get(option.header)
        if raw is not None:
            value = option.parse(raw)
            if value is None:
                raise _invalid(option.header, raw, option.expected)
            options[option.key] = value
        elif option.setting_is_default and getattr(settings, option.setting or "", None) is not None:
            options[option.key] = getattr(settings, option.setting or "")
    return options


# ---- rules across fields: each a small check of the values read ---------------------------------


def _server_value(option: DetectorOption, options: Mapping[str, Any], settings: Settings) -> Any:
    """The option's value for this request: the header's, else the server's setting (None without)."""
    if option.key in options:
        return options[option.key]
    return getattr(settings, option.setting, None) if option.setting else None


def _options_in_order(headers: Mapping[str, str], options: Mapping[str, Any], settings: Settings) -> None:
    """An option declared `not_above` another (cascade low <= high), the server's values standing in for
    an absent header."""
    declared = {option.key: option for option in declared_options()}
    for option in declared.values():
        upper = declared.get(option.not_above or "")
        if upper is None:
            continue
        low, high = _server_value(option, options, settings), _server_value(upper, options, settings)
        if low is not None and high is not None and low > high:
            raise PolicyError(
                f"Header {option.header} must not exceed {upper.header} (low {low}, high {high}).",
                param=option.header if option.header in headers else upper.header,
                code="invalid_header",
            )


def _within_server_limits(headers: Mapping[str, str], options: Mapping[str, Any], settings: Settings) -> None:
    """A request may lower an option the server caps (`ceiling`: the judge budget), not raise it."""
    for option in declared_options():
        limit = getattr(settings, option.setting, None) if option.setting else None
        if option.ceiling is None or limit is None or option.header not in headers:
            continue
        if options[option.key] > limit:
            raise PolicyError(
                f"Header {option.header} {option.ceiling.format(value=options[option.key], limit=limit)}.",
                param=option.header,
                code="invalid_header",
            )


def _judge_for_detector(values: Mapping[str, Any]) -> None:
    """A detector that calls a judge needs one (off mode runs no detector)."""
    detector = values["detector"]
    # a name the registry lacks was refused by the detector row already
    uses_judge = detector in DETECTORS and DETECTORS.declared(detector, "uses_judge")
    if values["mode"] != "off" and values["judge"] is None and uses_judge:
        raise PolicyError(
            f"The {detector} detector was requested but this server has no judges configured "
            f"(set FAITHPROXY_JUDGES, or choose another detector with {HEADER_DETECTOR}).",
            param=HEADER_DETECTOR,
            code="invalid_header",
        )


def policy_from_headers(
    headers: Mapping[str, str],
    settings: Settings,
    *,
    detectors: Collection[str],
    judges: Collection[str],
    hints_available: bool = False,
) -> RequestPolicy:
    """`detectors` and `judges` are the names this server can actually serve; `hints_available`: a hint
    judge is configured. The headers are read in the table's order, the detectors' options among them,
    each rule across fields once the values it compares are read."""
    served = Served(detectors, judges, hints_available)
    values: dict[str, Any] = {}
    _read(HEADERS[:_BEFORE_DETECTOR_OPTIONS], headers, settings, served, values)
    options = _detector_options(headers, settings)
    _options_in_order(headers, options, settings)
    _within_server_limits(headers, options, settings)
    _read(HEADERS[_BEFORE_DETECTOR_OPTIONS:], headers, settings, served, values)
    _judge_for_detector(values)
    return RequestPolicy(**values, options=MappingProxyType(options))
