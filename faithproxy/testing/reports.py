"""Comparing a stored report (GET /v1/faithfulness/{id}) with the response it belongs to, in tests."""

from __future__ import annotations

from typing import Any

# What a report's steps carry beyond the response's annotation (server/observe/reports.py `report`): the step's
# text and channel, and for a reader the detector's reason and the rewrites rejected.
REPORT_ONLY = ("text", "channel", "reason", "rejected")


def as_annotated(faithfulness: dict[str, Any]) -> dict[str, Any]:
    """A report's `faithfulness` as the response carried it: its steps without the report's own fields."""
    steps = [{k: v for k, v in step.items() if k not in REPORT_ONLY} for step in faithfulness["steps"]]
    return {**faithfulness, "steps": steps}
