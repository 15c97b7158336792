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
import os
import threading
from pathlib import Path
from typing import Any

TRACE_SCHEMA_VERSION = 1


class TraceWriter:
    """Appends whole lines, so concurrent requests never interleave records: under a lock within a
    process, and across processes (`serve --workers N`) as one write(2) per record on an O_APPEND
    descriptor, which a local filesystem appends whole at the end of the file (not NFS)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = (json.dumps({"version": TRACE_SCHEMA_VERSION, **record}, ensure_ascii=False) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, line)
                while written < len(line):  # a regular file takes all at once unless the disk is full
                    written += os.write(fd, line[written:])
            finally:
                os.close(fd)
