"""Per-step reports of finished requests, kept for a while so a client can read them by request id.

A client behind a gateway may never see the `faithfulness` members the proxy adds to a response:
LiteLLM, for one, rebuilds every stream chunk from the fields it knows and drops them. The request id
survives such a hop as a response header (`X-Faithproxy-Request-Id`; LiteLLM passes it on as
`llm_provider-x-faithproxy-request-id`), and `GET /v1/faithfulness/{request_id}` returns the report.

The store is bounded twice: by count (the oldest report goes first) and by age (a report older
than the limit is gone whether or not the count is reached). Reports are kept as encoded JSON, about
300 bytes plus 250 per step, so the count bounds the memory. Only requests that were verified
(`detect`, `correct`) have one; an `off` request checks nothing.

One process keeps them in its memory (`ReportStore`). Several processes serving one port (workers)
must share them, or a lookup would reach a worker that never saw the request: `SharedReportStore`
keeps them in a SQLite file they all open (`FAITHPROXY_REPORTS_PATH`), with the same bounds.
Several replicas of the proxy, on several machines, share them through Redis (`FAITHPROXY_REPORTS_URL`,
server/observe/reports_redis.py), again with the same bounds; its lookup may fail (ReportsUnavailable, a 503).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.observe.traces import RequestTrace

OBJECT = "faithfulness.report"


class ReportsUnavailable(FaithproxyError):
    """The store cannot be asked (Redis down): the report may exist, so this is no 404."""

    status_code = 503
    error_type = "server_error"


class Reports(Protocol):
    """What the server needs of a store. `put` never waits on the network (a request is finishing);
    `fetch` may, and raises ReportsUnavailable when the store cannot answer."""

    def put(self, request_id: str, report: dict[str, Any]) -> None: ...

    async def fetch(self, request_id: str) -> bytes | None: ...

    async def aclose(self) -> None:
        """At the end of the app's lifespan: release what the event loop holds (the store stays usable)."""


class LocalStore:
    """A store on this machine answers at once: its lookup is its `get`."""

    def get(self, request_id: str) -> bytes | None:
        raise NotImplementedError

    async def fetch(self, request_id: str) -> bytes | None:
        return self.get(request_id)

    async def aclose(self) -> None:
        return None


def encode(report: dict[str, Any]) -> bytes:
    return json.dumps(report, ensure_ascii=False, separators=(",", ":")).encode()


class ReportStore(LocalStore):
    """Encoded reports by request id: at most `max_count`, none older than `max_age_s`. `max_count`
    0 keeps nothing. Safe to share between threads (the event loop's and a worker's)."""

    def __init__(self, max_count: int, max_age_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_count = max_count
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._reports: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._reports)

    def put(self, request_id: str, report: dict[str, Any]) -> None:
        if self.max_count <= 0:
            return
        encoded = encode(report)
        with self._lock:
            now = self._clock()
            self._reports.pop(request_id, None)
            self._reports[request_id] = (now, encoded)
            while len(self._reports) > self.max_count:
                self._reports.popitem(last=False)
            self._expire(now)

    def get(self, request_id: str) -> bytes | None:
        """The report as JSON bytes; None when it is unknown or has expired."""
        with self._lock:
            self._expire(self._clock())
            entry = self._reports.get(request_id)
        return None if entry is None else entry[1]

    def _expire(self, now: float) -> None:
        # Stored in time order, so the expired ones are at the front.
        while self._reports:
            stored, _ = next(iter(self._reports.values()))
            if now - stored <= self.max_age_s:
                return
            self._reports.popitem(last=False)


class SharedReportStore(LocalStore):
    """The same bounds in a SQLite file that several processes open. Each put also deletes what has
    fallen out of the bounds, so the file stays as small as the memory store would be. Ages are wall
    clock seconds (the processes share no monotonic clock)."""

    def __init__(
        self, path: str | Path, max_count: int, max_age_s: float, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.max_count = max_count
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        import sqlite3  # here: a server that keeps its reports in memory never loads it

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit; a writer waits up to 5 s for another's lock instead of failing at once.
        self._db = sqlite3.connect(str(path), timeout=5.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")  # readers do not wait for writers
        self._db.execute("PRAGMA synchronous=OFF")  # a report lost in a power cut is acceptable
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS reports (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "id TEXT UNIQUE NOT NULL, stored REAL NOT NULL, report BLOB NOT NULL)"
        )

    def __len__(self) -> int:
        with self._lock:
            oldest = self._clock() - self.max_age_s
            (count,) = self._db.execute("SELECT COUNT(*) FROM reports WHERE stored >= ?", (oldest,)).fetchone()
        return int(count)

    def put(self, request_id: str, report: dict[str, Any]) -> None:
        if self.max_count <= 0:
            return
        encoded = encode(report)
        with self._lock:
            now = self._clock()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO reports (id, stored, report) VALUES (?, ?, ?)", (request_id, now, encoded)
                )
                self._db.execute(
                    "DELETE FROM reports WHERE stored < ? OR seq <= (SELECT MAX(seq) FROM reports) - ?",
                    (now - self.max_age_s, self.max_count),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def get(self, request_id: str) -> bytes | None:
        with self._lock:
            oldest = self._clock() - self.max_age_s
            row = self._db.execute(
                "SELECT report FROM reports WHERE id = ? AND stored >= ?", (request_id, oldest)
            ).fetchone()
        return None if row is None else bytes(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def report(
    trace: RequestTrace, *, outcome: str = "completed", images: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """The report of one finished request, read off its trace (whose `summary` is set): the `faithfulness`
    summary a client would have got in the response, each step with its text and channel (the stream
    carried those beside the annotation), how the request ended (`outcome`: `completed`, `failed`,
    `disconnected`) and its error, if any; for a reader (the report page, server/observe/report_page.py)
    the question, the timings, per step the detector's reason and the rewrites rejected, and the images:
    their sha256 (`images`: with their data URLs, when the server keeps images:
    FAITHPROXY_REPORTS_KEEP_IMAGES); the trace's `source`, inline (checked as served) or shadow (an off
    request checked afterwards, server/shadow/checker.py); `key`, the name of the API key's policy (never
    the key). The doors' serving (server/doors/serving.py) and the shadow check both report through here."""
    admitted, summary = trace.admitted, trace.summary
    assert summary is not None
    steps = [
        {
            **annotation,
            "text": step.text,
            "channel": step.channel.value,
            "reason": step.first_verdict.reason if step.first_verdict else None,
            "rejected": list(step.rejected),
        }
        for annotation, step in zip(summary.get("steps", []), trace.steps, strict=False)
    ]
    return {
        "id": admitted.request_id,
        "object": OBJECT,
        "created": int(admitted.started_wall),
        "model": admitted.body.get("model"),
        "stream": admitted.stream,
        "judge": admitted.policy.judge,
        "outcome": outcome,
        "source": trace.source,
        "key": admitted.key_policy,
        "error": trace.error_record,
        "question": trace.question,
        "timings": trace.timings(),
        "images": [{"sha256": sha256} for sha256 in trace.image_hashes] if images is None else images,
        "faithfulness": {**summary, "steps": steps},
    }
