"""The report page: a checked chain rendered for a person, from a stored report (GET /reports/{id},
server/doors/pages_router.py) or from a trace file's records (`faithproxy report TRACE.jsonl --html
OUT`), through the same Jinja2 templates (server/observe/templates/).

Both sources are turned into one plain view (`view_of_report`, `view_of_trace`): the question, the
images (their hashes; a stored report also holds their data URLs when the server keeps images,
FAITHPROXY_REPORTS_KEEP_IMAGES, and only raster types are shown inline), each step with its kind,
label and texts, the request's counts, timings and the judge's bill. A field the source does not hold
is None, and the page says so rather than guessing. Model text is hostile: the templates escape
everything (autoescape), and the pages load nothing from elsewhere (no CDN, no script), so they work
with JavaScript off.

`ListedReports` wraps the server's report store to list recent requests (GET /reports): the store
only answers by id, so each process keeps a bounded index of the reports it put, newest first.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faithproxy.server.observe.reports import Reports

TEMPLATES = Path(__file__).with_name("templates")


@functools.cache
def _env() -> Any:
    """The templates' Jinja2 environment, made (and Jinja2 imported) when a page is first rendered: a
    server nobody asks for a page never loads it."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    return Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )


# The labels a step can carry on the page, the filter's choices on the list.
LABELS = ("faithful", "unfaithful", "unsure", "fixed", "residual", "unchecked", "gated")
SOURCES = ("inline", "shadow")  # how a listed request was checked (server/observe/metrics.py Source)
PAGE_ROWS = 50  # rows on one page of the list


def step_label(step: dict[str, Any]) -> str | None:
    """faithful | unfaithful | unsure | fixed | residual | unchecked | gated; None for a step no detector
    was asked about (a reasoning step, or detector `none`). The evaluation events' labels (server/observe/otel.py)
    with `gated` apart from `unchecked` and a judge's unsure flag kept as such."""
    unchecked = step.get("unchecked_reason")
    if unchecked == "detector_none":
        return None
    if unchecked == "gated":
        return "gated"
    if unchecked:
        return "unchecked"
    detected = step.get("detected")
    if detected in (None, "unknown"):
        return None
    if step.get("original_text") is not None and not step.get("residual"):
        return "fixed"
    if step.get("residual"):
        return "residual"
    return detected if detected in ("unfaithful", "unsure") else "faithful"


def _step_view(step: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": step.get("index"),
        "kind": step.get("kind"),
        "channel": step.get("channel"),
        "label": step_label(step),
        "text": step.get("text"),
        "original_text": step.get("original_text"),
        "rejected": step.get("rejected"),  # None: the source does not keep them (stored reports)
        "reason": step.get("reason"),
        "confidence": step.get("confidence"),
        "attempts": step.get("attempts", 0),
        "residual_reason": step.get("residual_reason"),
        "unchecked_reason": step.get("unchecked_reason"),
        "latency_s": step.get("detector_latency_s"),
    }


_COUNTS = ("perception_steps", "unfaithful_detected", "residual", "upr_detected", "upr_residual", "fixed")
_BILL = ("calls", "input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")


def _iso(seconds: Any) -> str | None:
    if not isinstance(seconds, int | float):
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


# Inline only what an <img> shows as pixels: no SVG (a document of its own), nothing but data URLs.
_SHOWN = ("data:image/png;", "data:image/jpeg;", "data:image/gif;", "data:image/webp;")


def _images(raw: Any) -> list[dict[str, str | None]]:
    """Each image as {sha256, src}: a trace holds hashes; a report {sha256, data_url?} objects."""
    out: list[dict[str, str | None]] = []
    for image in raw if isinstance(raw, list) else []:
        if isinstance(image, str):
            out.append({"sha256": image, "src": None})
        elif isinstance(image, dict):
            url = image.get("data_url")
            shown = isinstance(url, str) and url.startswith(_SHOWN)
            out.append({"sha256": str(image.get("sha256", "")), "src": url if shown else None})
    return out


def _bill(block: Any) -> dict[str, Any] | None:
    if not isinstance(block, dict):
        return None
    return {name: block.get(name, 0) for name in _BILL}


def _seen(steps: list[dict[str, Any]]) -> dict[str, str]:
    """The text the client was sent, per channel (reasoning, content): the steps' final texts, one space
    between steps (a step's text holds no surrounding whitespace)."""
    out: dict[str, list[str]] = {}
    for step in steps:
        out.setdefault(step.get("channel") or "content", []).append(step.get("text") or "")
    return {channel: " ".join(texts) for channel, texts in out.items()}


def _view(source: dict[str, Any], summary: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields both sources name alike."""
    error = source.get("error")
    return {
        "id": str(source.get("id", "")),
        "model": source.get("model"),
        "mode": summary.get("mode") or source.get("mode"),
        "detector": summary.get("detector") or source.get("detector"),
        "judge": source.get("judge"),
        "stream": source.get("stream"),
        "error": error.get("message") if isinstance(error, dict) else None,
        "steps": [_step_view(s) for s in steps],
        "seen": _seen(steps),
        "counts": {name: summary.get(name) for name in _COUNTS} if summary else None,
        "regenerations": summary.get("regenerations"),
        "rounds": summary.get("rounds"),
        "source": source.get("source") or "inline",
        "key": source.get("key"),
    }


def view_of_report(report: dict[str, Any]) -> dict[str, Any]:
    """The page's view of a stored report (server/observe/reports.py `report`). Stored reports hold no
    question, timings, each step's reason and rejected rewrites, and the images (hashes; data URLs when kept)."""
    summary = report.get("faithfulness") or {}
    view = _view(report, summary, list(summary.get("steps") or []))
    view.update(
        time=_iso(report.get("created")),
        outcome=report.get("outcome"),
        question=report.get("question"),
        images=_images(report.get("images")),
        timings={"verification_s": summary.get("verification_s"), **(report.get("timings") or {})},
        bill=_bill(summary.get("judge")),
    )
    return view


def view_of_trace(record: dict[str, Any]) -> dict[str, Any]:
    """The page's view of one trace record (server/observe/traces.py, schema version 1)."""
    summary = record.get("summary") or {}
    view = _view(record, summary, list(record.get("steps") or []))
    failed = record.get("error") is not None
    view.update(
        time=_iso(record.get("time")),
        outcome="disconnected" if record.get("disconnected") else "failed" if failed else "completed",
        question=record.get("prompt"),
        images=_images(record.get("images")),
        timings=record.get("timings") or {},
        bill=_bill(record.get("judge_usage") or summary.get("judge")),
    )
    return view


def list_row(view: dict[str, Any]) -> dict[str, Any]:
    """One line of the list: the request and its counts, and the labels its steps carry."""
    counts = view["counts"] or {}
    return {
        "id": view["id"],
        "time": view["time"],
        "model": view["model"],
        "mode": view["mode"],
        "detector": view["detector"],
        "outcome": view["outcome"],
        "steps": len(view["steps"]),
        "upr_detected": counts.get("upr_detected"),
        "upr_residual": counts.get("upr_residual"),
        "labels": sorted({s["label"] for s in view["steps"] if s["label"]}),
        "source": view["source"],
        "key": view["key"],
    }


def report_row(report: dict[str, Any]) -> dict[str, Any]:
    """`list_row` of a stored report, built without the page's view (every verified request pays it)."""
    summary = report.get("faithfulness") or {}
    steps = summary.get("steps") or []
    return {
        "id": str(report.get("id", "")),
        "time": _iso(report.get("created")),
        "model": report.get("model"),
        "mode": summary.get("mode"),
        "detector": summary.get("detector"),
        "outcome": report.get("outcome"),
        "steps": len(steps),
        "upr_detected": summary.get("upr_detected"),
        "upr_residual": summary.get("upr_residual"),
        "labels": sorted({label for label in map(step_label, steps) if label}),
        "source": report.get("source") or "inline",
        "key": report.get("key"),
    }


@dataclass(frozen=True)
class RowFilter:
    """The list's filters: the model and the key policy named exactly, the source, and a verdict carried by
    at least one step. None: any."""

    model: str | None = None
    verdict: str | None = None
    key: str | None = None
    source: str | None = None

    def __call__(self, row: dict[str, Any]) -> bool:
        if self.model and row.get("model") != self.model:
            return False
        if self.key and row.get("key") != self.key:
            return False
        if self.source and (row.get("source") or "inline") != self.source:
            return False
        return not self.verdict or self.verdict in row.get("labels", ())


def matches(row: dict[str, Any], model: str | None, verdict: str | None) -> bool:
    """The list's filters: the model named exactly; a verdict carried by at least one step."""
    return RowFilter(model, verdict)(row)


def render_report(view: dict[str, Any], *, list_href: str) -> str:
    return _env().get_template("report.html").render(r=view, list_href=list_href)


def render_list(
    rows: Iterable[dict[str, Any]],
    *,
    href: Callable[[str], str],
    model: str | None = None,
    verdict: str | None = None,
    form: bool = True,
    note: str | None = None,
    filters: RowFilter | None = None,
    pages: tuple[str | None, str | None] = (None, None),
) -> str:
    """`href(id)` links a row to its page; `form` shows the filter form (the server's page; a static
    file has no server to filter); `filters` the filters in force (else `model` and `verdict`); `pages`
    the links to the newer and the older page, if any."""
    f = filters or RowFilter(model, verdict)
    template = _env().get_template("reports.html")
    return template.render(
        rows=list(rows),
        href=href,
        model=f.model or "",
        verdict=f.verdict or "",
        key=f.key or "",
        source=f.source or "",
        labels=LABELS,
        sources=SOURCES,
        form=form,
        note=note,
        newer=pages[0],
        older=pages[1],
    )


class ListedReports:
    """The server's report store with a list of what this process put, newest first, for GET /reports.
    Everything else is the store's (lookups, closing). The index holds one small row per report, as
    many and for as long as the store keeps reports, so the list costs the store nothing; a row the
    store has already dropped leads to the page's 404. A store that lists its rows itself (Redis:
    server/observe/reports_redis.py `rows`) lists every replica's requests instead, and this process keeps
    no index; with a SQLite file each worker lists its own."""

    def __init__(
        self, store: Reports, max_rows: int, max_age_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()  # oldest first

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def put(self, request_id: str, report: dict[str, Any]) -> None:
        shared = getattr(self.store, "rows", None) is not None
        if shared or self.max_rows <= 0:
            self.store.put(request_id, report)
            return
        self.store.put(request_id, report)
        row = report_row(report)
        with self._lock:
            self._rows.pop(request_id, None)
            self._rows[request_id] = (self._clock(), row)
            while len(self._rows) > self.max_rows:
                self._rows.popitem(last=False)

    def recent(self, *, model: str | None = None, verdict: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """This process's newest rows first, at most `limit`, those that pass the filters (`matches`)."""
        return self._local(RowFilter(model, verdict))[:limit]

    def _local(self, keep: RowFilter) -> list[dict[str, Any]]:
        with self._lock:
            now = self._clock()
            while self._rows and now - next(iter(self._rows.values()))[0] > self.max_age_s:
                self._rows.popitem(last=False)
            newest_first = [row for _, row in reversed(self._rows.values())]
        return [row for row in newest_first if keep(row)]

    async def page(
        self, keep: RowFilter, page: int = 1, per_page: int = PAGE_ROWS
    ) -> tuple[list[dict[str, Any]], bool]:
        """Page `page` (from 1) of the rows `keep` accepts, newest first, and whether an older page follows:
        every replica's when the store lists itself (it may raise ReportsUnavailable), else this process's."""
        offset = (max(page, 1) - 1) * per_page
        shared = getattr(self.store, "rows", None)
        if shared is not None:
            rows, more = await shared(keep, offset, per_page)
            return rows, more
        matched = self._local(keep)
        return matched[offset : offset + per_page], len(matched) > offset + per_page


def read_trace(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a trace file, in order; a line that is not a JSON object is a ValueError naming
    its line number."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{number}: not a JSON line ({e})") from None
            if not isinstance(record, dict) or "id" not in record:
                raise ValueError(f"{path}:{number}: not a trace record (no id)")
            yield record


def page_name(request_id: str) -> str:
    """A request's page file in a static folder: the id with anything but [A-Za-z0-9_-] replaced."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in request_id)
    return f"{safe or '_'}.html"


def write_static(records: Iterable[dict[str, Any]], out: str | Path) -> int:
    """index.html (the list, newest first) and one page per request into folder `out`; returns the
    number of requests. Records of `off` requests (no steps checked) are listed too."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for record in records:
        view = view_of_trace(record)
        (folder / page_name(view["id"])).write_text(render_report(view, list_href="index.html"), encoding="utf-8")
        rows.append(list_row(view))
    rows.reverse()
    note = f"{len(rows)} requests from a trace file."
    (folder / "index.html").write_text(render_list(rows, href=page_name, form=False, note=note), encoding="utf-8")
    return len(rows)
