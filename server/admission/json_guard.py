"""A request body's JSON, read with bounds: nesting depth and integer size are checked before or while
parsing, so no body can make the parser recurse or allocate without bound.

    input                                     found by                             answer
    arrays/objects nested > MAX_DEPTH         a pre-scan of the raw bytes          400 nesting_too_deep
    an integer of more than MAX_INT_DIGITS    json's parse_int hook, set only      400 number_too_large
                                              when the bytes hold such a digit run
    a number beyond a double (1e999)          json's parse_float hook, set with    400 number_too_large
                                              parse_int or for a 3-digit exponent
    NaN, Infinity, -Infinity (not JSON)       json's parse_constant hook           400 invalid_json
    a lone surrogate ("\ud800" unpaired)      re-encoding the value, only when the  400 invalid_unicode
                                              bytes hold an escaped or raw surrogate
    anything else that is not JSON            json.loads                           400 invalid_json

Python's json decoder recurses once per nesting level: a body nested 100,000 arrays deep raised
RecursionError (a 500). The pre-scan needs no recursion: it drops strings (their brackets do not
nest), keeps only the brackets, removes innermost pairs a few rounds at a time in C, and walks what is
left once, stopping at the first level past the limit. Most bodies have fewer brackets than the limit
and skip the scan altogether: off mode's admission stays cheap. Nothing here is asynchronous.

JSON's grammar lets a string escape half a surrogate pair, and Python's json reads bytes with
"surrogatepass", so a string can come out holding a code point that UTF-8 cannot encode. Every later
encoding of it (the report, an SSE frame, the trace, the body sent upstream) raised UnicodeEncodeError,
a 500; it is refused here, once, instead.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from faithproxy.faithcore.errors import PolicyError

MAX_DEPTH = 64  # OpenAI bodies nest a handful of levels; tool parameter schemas a few more
MAX_INT_DIGITS = 20  # every integer OpenAI takes (token counts, seeds) fits in 64 bits: 20 digits
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)  # unterminated: to the end (json refuses it)
# What may hold a number the hooks must see: a run of more than MAX_INT_DIGITS digits, or an exponent of
# three digits (1e999 is inf to Python, and "Infinity" once re-encoded). Found by mapping the bytes to
# digit / exponent / sign / other and searching the result: C speed, unlike a regex on a large body.
# The same pass maps both opening brackets to "[": their count bounds the depth.
_SHAPE = {**{d: "0" for d in b"0123456789"}, **{c: "e" for c in b"eE"}, **{c: "+" for c in b"+-"}}
_NUMBERISH = bytes(ord(_SHAPE.get(b, "[" if b in b"[{" else " ")) for b in range(256))
_RISKY = (b"0" * (MAX_INT_DIGITS + 1), b"e000", b"e+000")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_EMPTY = re.compile(rb"\[\]|\{\}")  # one pass takes one level: "{[]}" becomes "{}", not ""
_ROUNDS = 8  # pair-removal rounds done in C before the walk: wide bodies shrink to nothing in them
# An escaped surrogate (\ud800-\udfff, paired or not) or one encoded raw (CESU-8: ED A0-BF ..).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def load_json(raw: bytes) -> Any:
    """`raw` as a JSON value, or a PolicyError (400) for a body that is not JSON or exceeds the bounds."""
    shape = raw.translate(_NUMBERISH)
    check_depth(raw, opening=shape.count(b"["))
    hooks: dict[str, Any] = {"parse_constant": _no_constant}
    if any(run in shape for run in _RISKY):  # maybe only in strings: the hooks see numbers, never strings
        hooks["parse_int"] = _bounded_int
        hooks["parse_float"] = _finite_float
    try:
        value = json.loads(raw, **hooks)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise PolicyError(f"Request body is not valid JSON: {exc}", code="invalid_json") from exc
    if (b"\\u" in raw or b"\xed" in raw) and _SURROGATE.search(raw):  # two C scans; the rest only then
        _check_unicode(value)
    return value


def _check_unicode(value: Any) -> None:
    """A PolicyError (400 invalid_unicode) when a string of `value` holds a lone surrogate: pairs were
    joined by json.loads, so what UTF-8 cannot encode now is unpaired."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        message = f"Request body has a lone surrogate (U+{ord(exc.object[exc.start]):04X}): not valid Unicode."
        raise PolicyError(message, code="invalid_unicode") from exc


def check_depth(raw: bytes, opening: int | None = None) -> None:
    """A PolicyError (400 nesting_too_deep) when arrays and objects nest deeper than MAX_DEPTH. Brackets
    that do not pair up are left for json.loads to refuse: only the depth matters here. `opening`: the
    count of "[" and "{" in `raw`, when the caller has it."""
    if opening is None:
        opening = raw.count(b"[") + raw.count(b"{")
    if opening <= MAX_DEPTH:
        return
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    removed = 0
    while brackets and removed < _ROUNDS:
        inner = _EMPTY.sub(b"", brackets)
        if len(inner) == len(brackets):
            break  # what is left does not pair up: json.loads will say so
        brackets, removed = inner, removed + 1
    depth = removed  # each round took one level off the deepest path
    for byte in brackets:
        depth += 1 if byte in (0x5B, 0x7B) else -1
        if depth > MAX_DEPTH:
            raise PolicyError(
                f"Request body nests arrays and objects deeper than {MAX_DEPTH} levels.", code="nesting_too_deep"
            )


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise PolicyError(f"Request body has an integer of more than {MAX_INT_DIGITS} digits.", code="number_too_large")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise PolicyError(f"Request body has a number too large for a double: {text[:40]}", code="number_too_large")
    return value


def _no_constant(name: str) -> Any:
    raise PolicyError(f"Request body is not valid JSON: {name} is not a JSON number.", code="invalid_json")
