"""Trace records: one JSON line per request, appended to a file, safe under concurrent requests, and
`RequestTrace`, how one request ended (server/observe/finish.py counts it and writes its record).

Schema version 1 (fields): version, id, time (unix seconds, start), model, mode, source (inline; shadow: the
after-the-fact check of an off request, server/shadow/checker.py, written as a second record under the
request's id, with mode off and the checked steps), detector, judge,
prompt (the last user message's text), images (sha256 list, never the bytes), steps (index, channel,
kind, text, original_text, verdict, the detector's reason, attempts, rejected candidates, residual, unchecked_reason,
detector latency), answer, finish_reason, usage, timings (duration_s, ttft_s, verification_s), error,
summary (the `faithfulness` summary, whose `judge` block is the request's judge bill: calls, input,
cached input, cache-creation and output tokens, descriptions, budget_steps), and judge_usage (the same
bill beside `usage`, so generator and judge tokens read side by side).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.observe.summary import trace_steps
from faithproxy.server.protocol.errors import error_body

if TYPE_CHECKING:
    from faithproxy.faithcore.types import Step

TRACE_SCHEMA_VERSION = 1

log = logging.getLogger("faithproxy")


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


class RecordedPolicy(Protocol):
    """What a record keeps of a request's policy (server/admission/policy.py's `RequestPolicy`)."""

    @property
    def mode(self) -> str: ...
    @property
    def detector(self) -> str: ...
    @property
    def judge(self) -> str | None: ...


class RecordedRequest(Protocol):
    """What a record keeps of an admitted request (server/admission/admit.py's `Admitted`). observe/ sits
    below admission/ (admission counts its refusals in observe's metrics), so the record names the fields
    it reads instead of importing the class."""

    body: dict[str, Any]
    request_id: str
    started: float
    started_wall: float
    key_policy: str
    endpoint: str
    shadow: bool  # an off request sampled for a shadow check (counted by the check, not here)

    @property
    def policy(self) -> RecordedPolicy: ...
    @property
    def stream(self) -> bool: ...


@dataclass(slots=True)
class RequestTrace:
    """How one admitted request ended, in plain values. The fields after `disconnected` are what a
    correction session did; their defaults are a request that had none (off mode, or one that failed
    before its session started)."""

    admitted: RecordedRequest
    status: int = 200  # the HTTP status sent; an error's own status wins
    ttft: float | None = None  # seconds from arrival to the first byte of the answer
    error: FaithproxyError | None = None
    disconnected: bool = False
    hints: dict[str, Any] | None = None  # what the hint stage did (server/chain/hints.py)
    question: str | None = None
    image_hashes: Sequence[str] = ()
    steps: Sequence[Step] = ()  # turned into the record's step dicts only when a record is written
    answer: str | None = None
    reasoning: str | None = None
    summary: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    judge_usage: dict[str, Any] | None = None
    verification_s: float = 0.0
    # inline: the record of a request as served; shadow: the after-the-fact check of an off request
    # (server/shadow/checker.py), a second record under the same id
    source: str = "inline"

    @property
    def error_record(self) -> dict[str, Any] | None:
        """The error as the client was told it (the OpenAI `error` object), or None."""
        return error_body(self.error)["error"] if self.error is not None else None

    def timings(self, duration: float | None = None) -> dict[str, Any]:
        """duration_s (since the request arrived, unless given), ttft_s, verification_s."""
        if duration is None:
            duration = time.perf_counter() - self.admitted.started
        return {
            "duration_s": round(duration, 6),
            "ttft_s": round(self.ttft, 6) if self.ttft is not None else None,
            "verification_s": round(self.verification_s, 6),
        }

    def record(self, duration: float) -> dict[str, Any]:
        """The trace line's fields (TraceWriter adds `version`)."""
        admitted = self.admitted
        policy = admitted.policy
        return {
            "id": admitted.request_id,
            "time": admitted.started_wall,
            "model": admitted.body.get("model"),
            "mode": policy.mode,
            "source": self.source,
            "detector": policy.detector,
            "judge": policy.judge,
            "stream": admitted.stream,
            "prompt": self.question,
            "images": list(self.image_hashes),
            "steps": trace_steps(self.steps),
            "answer": self.answer,
            "reasoning": self.reasoning,
            "summary": self.summary,
            "usage": self.usage,
            "judge_usage": self.judge_usage,
            "timings": self.timings(duration),
            "hints": self.hints,
            "disconnected": self.disconnected,
            "error": self.error_record,
        }
