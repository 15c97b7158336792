"""What the proxy recorded, read back as plain values: trace files (JSON lines) and reports in Redis.

Both sources become `Recorded` requests with `RecordedStep`s; the exporter (flywheel/pairs.py) never
looks at which one it came from. The server is not imported: a trace line and a report are read as
the JSON they are (server/observe/traces.py and server/observe/reports.py define them), so exporting
needs neither the proxy's settings nor its libraries.

- A trace line carries `version` (the trace schema): a line of another version is refused with the
  version it has and the one this reader knows, never half-read. A trace keeps the images' sha256 only.
- A report (`GET /v1/faithfulness/{id}`, or Redis's `faithproxy:reports:<id>`) has no version field;
  it carries each image's data URL when the proxy ran with FAITHPROXY_REPORTS_KEEP_IMAGES.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faithproxy.faithcore.errors import BenchmarkError

# The trace schema versions this reader understands (server/observe/traces.py TRACE_SCHEMA_VERSION;
# tests/flywheel/test_records.py keeps the two in step).
TRACE_VERSIONS = (1,)
REPORT_OBJECT = "faithfulness.report"
REDIS_PREFIX = "faithproxy:reports:"  # server/observe/reports_redis.py PREFIX
REDIS_INDEX = REDIS_PREFIX + "index"


class FlywheelError(BenchmarkError):
    """A recorded file or store the flywheel cannot read as asked (a bad line, a schema it does not know,
    an image that is not at hand)."""


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One step as the proxy recorded it. `original_text` is the model's own text when the step was
    rewritten (then `text` is the rewrite the client got); `rejected` are rewrites the detector refused."""

    index: int
    channel: str
    kind: str
    text: str
    original_text: str | None = None
    verdict: str | None = None  # of the delivered text
    detected: str | None = None  # of the model's own text
    confidence: float | None = None
    reason: str | None = None
    attempts: int = 0
    rejected: tuple[str, ...] = ()
    residual: bool = False

    @property
    def corrected(self) -> bool:
        """A flagged step whose rewrite passed the detector."""
        return self.original_text is not None and not self.residual and self.verdict == "faithful"


@dataclass(frozen=True, slots=True)
class Recorded:
    """One verified request: who served it and what its steps became."""

    request_id: str
    model: str | None
    detector: str | None
    judge: str | None
    question: str | None
    image_hashes: tuple[str, ...]
    steps: tuple[RecordedStep, ...]
    source: str  # "trace" or "report"
    image_urls: dict[str, str] = field(default_factory=dict)  # sha256 -> data URL, when the report kept it
    # The delivered text of each channel ("content", "reasoning"), where the record keeps it (a trace
    # does; a report keeps the steps only): the chain before a step is cut from it, spacing and tags included.
    texts: dict[str, str] = field(default_factory=dict)


def _step(raw: Any, where: str) -> RecordedStep:
    if not isinstance(raw, dict) or not isinstance(raw.get("text"), str) or not isinstance(raw.get("index"), int):
        raise FlywheelError(f"{where}: a step must be an object with an integer 'index' and a 'text'")
    confidence = raw.get("confidence")
    return RecordedStep(
        index=raw["index"],
        channel=str(raw.get("channel") or "content"),
        kind=str(raw.get("kind") or ""),
        text=raw["text"],
        original_text=raw.get("original_text"),
        verdict=raw.get("verdict"),
        detected=raw.get("detected"),
        confidence=float(confidence) if isinstance(confidence, int | float) else None,
        reason=raw.get("reason"),
        attempts=int(raw.get("attempts") or 0),
        rejected=tuple(raw.get("rejected") or ()),
        residual=bool(raw.get("residual")),
    )


def from_trace(record: dict[str, Any], where: str) -> Recorded | None:
    """A trace line's request; None for one that ran no session (off mode, failed before its steps)."""
    version = record.get("version")
    if version not in TRACE_VERSIONS:
        known = ", ".join(map(str, TRACE_VERSIONS))
        if isinstance(version, int) and version < min(TRACE_VERSIONS):
            raise FlywheelError(
                f"{where}: trace schema version {version} is older than this exporter reads ({known}); "
                "traces of that version lack what pairs need: record them again with this faithproxy"
            )
        raise FlywheelError(
            f"{where}: trace schema version {version!r} is not one this exporter reads ({known}): "
            "a newer proxy wrote it, export with the same faithproxy release"
        )
    steps = record.get("steps")
    if not steps:
        return None
    if not isinstance(steps, list) or not isinstance(record.get("id"), str):
        raise FlywheelError(f"{where}: a trace record needs an 'id' and a list of 'steps'")
    return Recorded(
        request_id=record["id"],
        model=record.get("model"),
        detector=record.get("detector"),
        judge=record.get("judge"),
        question=record.get("prompt"),
        image_hashes=tuple(record.get("images") or ()),
        steps=tuple(_step(s, f"{where} step {i}") for i, s in enumerate(steps)),
        source="trace",
        texts={
            channel: text
            for channel, text in (("content", record.get("answer")), ("reasoning", record.get("reasoning")))
            if isinstance(text, str)
        },
    )


def from_report(report: dict[str, Any], where: str) -> Recorded | None:
    """A report's request (server/observe/reports.py `report`); None for one without steps."""
    if report.get("object") != REPORT_OBJECT:
        raise FlywheelError(f"{where}: not a faithfulness report (object {report.get('object')!r})")
    faithfulness = report.get("faithfulness") or {}
    steps = faithfulness.get("steps") or []
    if not steps:
        return None
    images = [i for i in report.get("images") or [] if isinstance(i, dict) and "sha256" in i]
    return Recorded(
        request_id=str(report.get("id")),
        model=report.get("model"),
        detector=faithfulness.get("detector"),
        judge=report.get("judge"),
        question=report.get("question"),
        image_hashes=tuple(i["sha256"] for i in images),
        steps=tuple(_step(s, f"{where} step {i}") for i, s in enumerate(steps)),
        source="report",
        image_urls={i["sha256"]: i["data_url"] for i in images if isinstance(i.get("data_url"), str)},
    )


def read_traces(paths: Iterable[Path]) -> Iterator[Recorded]:
    """The verified requests of trace files, in file order."""
    for path in paths:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise FlywheelError(f"{where}: not a JSON line ({exc.msg})") from exc
                if not isinstance(record, dict):
                    raise FlywheelError(f"{where}: a trace line must be a JSON object")
                recorded = from_trace(record, where)
                if recorded is not None:
                    yield recorded


def read_redis(url: str, *, prefix: str = REDIS_PREFIX) -> Iterator[Recorded]:
    """The reports a Redis holds (the proxy's FAITHPROXY_REPORTS_URL), oldest first, through its index."""
    from redis import Redis
    from redis.exceptions import RedisError

    client = Redis.from_url(url, socket_timeout=30)
    try:
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in client.zrange(prefix + "index", 0, -1)]
        for request_id in ids:
            raw = client.get(prefix + request_id)
            if raw is None:  # expired between the index and the read
                continue
            recorded = from_report(json.loads(raw), f"redis {prefix}{request_id}")
            if recorded is not None:
                yield recorded
    except RedisError as exc:
        raise FlywheelError(f"cannot read the reports in {url}: {exc}") from exc
    finally:
        client.close()
