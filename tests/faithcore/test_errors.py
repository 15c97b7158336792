"""Raise sites name error codes by their enum, so every code raised is one the metrics count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("faithcore", "clients", "detectors", "regenerators", "server")
# Calls whose `code` is a detector or upstream reason: the error classes and the judges' helper.
CODED = {"DetectorError", "UpstreamError", "judge_error"}


def literal_codes(source: str) -> list[int]:
    """Lines where one of CODED is called with a string literal as its code."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name not in CODED:
            continue
        values = [kw.value for kw in node.keywords if kw.arg == "code"]
        if name == "judge_error" and len(node.args) >= 2:
            values.append(node.args[1])
        if any(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in values):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_literal_code() -> None:
    assert literal_codes('raise DetectorError("x", code="timeout")\nraise judge_error(n, "bad_response", k)') == [1, 2]
    assert literal_codes("raise DetectorError('x', code=DetectorErrorCode.TIMEOUT)") == []


@pytest.mark.parametrize("folder", PRODUCT)
def test_product_code_raises_enum_codes(folder: str) -> None:
    found = {
        str(path.relative_to(REPO)): lines
        for path in sorted((REPO / folder).rglob("*.py"))
        if (lines := literal_codes(path.read_text(encoding="utf-8")))
    }
    assert not found, f"error codes spelled as strings (use DetectorErrorCode / UpstreamErrorCode): {found}"
