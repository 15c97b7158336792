"""Trace records: one JSON line per request, appended to a file, safe under concurrent requests.

Schema version 1 (fields): version, id, time (unix seconds, start), model, mode, detector, judge,
prompt (the last user message's text), images (sha256 list, never the bytes), steps (index, channel,
kind, text, original_text, verdict, attempts, rejected candidates, residual, unchecked_reason,
detector latency), answer, finish_reason, usage, timings (duration_s, ttft_s, verification_s), error,
summary (the `faithfulness` summary, whose `judge` block is the request's judge bill: calls, input,
cached input, cache-creation and output tokens, descriptions, budget_steps), and judge_usage (the same
bill beside `usage`, so generator and judge tokens read side by side).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

TRACE_SCHEMA_VERSION = 1


class TraceWriter:
    """Appends whole lines under a lock, so concurrent requests never interleave records."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = json.dumps({"version": TRACE_SCHEMA_VERSION, **record}, ensure_ascii=False) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
