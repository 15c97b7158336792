"""GET /reports and GET /reports/{request_id}: the report pages, HTML for a person (server/observe/report_page.py).

Behind the same API keys as the API (the auth middleware guards every path but the probes). The list
is the recent checked requests (every replica's when reports are in Redis, else this process's), newest
first, 50 a page (`page`), filterable by model, key policy name (`key`), source (inline, shadow) and by a
verdict one of its steps carries; a page is the stored report by id, a 404 page when it is unknown or
expired, and the store's own status (a 503) when it cannot be asked.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.server.observe.report_page import (
    LABELS,
    SOURCES,
    ListedReports,
    RowFilter,
    render_list,
    render_report,
    view_of_report,
)
from faithproxy.server.state import StateDep

router = APIRouter(include_in_schema=False)  # pages for people, not part of the OpenAPI surface


def _href(request_id: str) -> str:
    return f"/reports/{quote(request_id, safe='')}"


@router.get("/reports", response_class=HTMLResponse)
async def report_list(
    state: StateDep,
    model: str | None = Query(None, max_length=256),
    verdict: str | None = Query(None, max_length=32),
    key: str | None = Query(None, max_length=256),
    source: str | None = Query(None, max_length=16),
    page: int = Query(1, ge=1, le=10_000),
) -> HTMLResponse:
    filters = RowFilter(
        model or None, verdict if verdict in LABELS else None, key or None, source if source in SOURCES else None
    )
    store = state.reports
    rows: list[dict[str, Any]] = []
    more = False
    try:
        if isinstance(store, ListedReports):
            rows, more = await store.page(filters, page)
    except FaithproxyError as e:  # the shared store cannot be asked
        return HTMLResponse(render_list([], href=_href, filters=filters, note=e.message), status_code=e.status_code)
    pages = (_page_href(filters, page - 1) if page > 1 else None, _page_href(filters, page + 1) if more else None)
    return HTMLResponse(render_list(rows, href=_href, filters=filters, pages=pages))


def _page_href(filters: RowFilter, page: int) -> str:
    query = {k: v for k, v in dataclasses.asdict(filters).items() if v}
    return "/reports?" + urlencode({**query, "page": page})


@router.get("/reports/{request_id}", response_class=HTMLResponse)
async def report_page(request_id: str, state: StateDep) -> HTMLResponse:
    store = state.reports
    try:
        encoded = await store.fetch(request_id) if store is not None else None
    except FaithproxyError as e:  # the shared store cannot be asked: the report may exist
        return HTMLResponse(render_list([], href=_href, form=False, note=e.message), status_code=e.status_code)
    if encoded is None:
        note = f"No report for request '{request_id[:64]}': unknown or expired."
        return HTMLResponse(render_list([], href=_href, form=False, note=note), status_code=404)
    return HTMLResponse(render_report(view_of_report(json.loads(encoded)), list_href="/reports"))
