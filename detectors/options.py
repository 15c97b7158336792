"""Per-request detector options, as a detector declares them: the header, the key, how to read it.

A detector lists its options on its class (`Detector.options`); the server's header table
(server/admission/policy.py) reads every registered detector's declarations, so a new option touches only its
detector's file. A parser returns the value, or None when the header's text is not one; the server then
answers 400 with "Expected <expected>." and the header's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def probability(raw: str) -> float | None:
    """A number from 0 to 1 (NaN and anything unreadable: None)."""
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None  # NaN fails the comparison too


def whole_number(limit: int) -> Callable[[str], int | None]:
    """A parser of ASCII digits only (no sign, no exponent, no other script's digits) up to `limit`."""

    def parse(raw: str) -> int | None:
        value = raw.strip()
        if not value.isascii() or not value.isdigit() or int(value) > limit:
            return None
        return int(value)

    return parse


@dataclass(frozen=True)
class DetectorOption:
    """One per-request option of a detector.

    `key` names it in `RequestView.options`; `header` is the request header that sets it; `parse` reads
    the header's text (None: invalid) and `expected` ends the 400's message ("Expected {expected}.").
    `setting` names the `Settings` field holding the server's value of the same knob (the server passes
    its value to the detector when it is built, through DetectorDeps): with `setting_is_default` the
    request gets that value when it sends no header; with `ceiling` (a phrase with `{value}` and
    `{limit}`) a request may lower the server's value but not raise it. `not_above` names another option
    of the same detector that this one may not exceed (the server's value standing in for an absent
    header).
    """

    key: str
    header: str
    parse: Callable[[str], Any | None]
    expected: str
    setting: str | None = None
    setting_is_default: bool = False
    ceiling: str | None = None
    not_above: str | None = None
