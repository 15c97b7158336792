"""One report index for a fleet (server/observe/reports_redis.py `rows`, GET /reports): two proxies share one
real redis-server; each lists both replicas' requests, newest first, filtered and paged, and shows any
replica's report page."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.observe.report_page import RowFilter
from faithproxy.server.observe.reports_redis import RedisReportStore
from faithproxy.server.settings import Settings
from faithproxy.testing import SENTENCES, FakeUpstream, running_app
from tests.redis_server import RedisServer

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}]}


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _empty(redis_url: str) -> None:
    import redis

    redis.Redis.from_url(redis_url).flushall()


@contextlib.asynccontextmanager
async def replicas(redis_url: str, count: int = 2) -> AsyncIterator[list[tuple[httpx.AsyncClient, Any]]]:
    """`count` proxies sharing `redis_url` for reports; each with shadow sampling of every off request."""
    judge_app = create_judge_app({"unfaithful": [SENTENCES[0].strip()]})
    async with contextlib.AsyncExitStack() as stack:
        judge_url = await stack.enter_async_context(running_judge_server(judge_app))
        judge = JudgeConfig(name="claude", backend="anthropic", model="judge-model", base_url=judge_url,
                            api_key="sk-test", timeout_s=5, max_retries=0)  # type: ignore[arg-type]  # fmt: skip
        out = []
        for _ in range(count):
            settings = Settings(upstream_url="http://vllm.test", judges=[judge], max_retries=0, shadow_share=1.0,
                                reports_url=redis_url)  # type: ignore[arg-type]  # fmt: skip
            app = create_app(settings, upstream_transport=FakeUpstream().transport())
            url = await stack.enter_async_context(running_app(app))
            http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
            out.append((http, app.state.faithproxy))
        yield out


def listed(page: str) -> list[str]:
    """The request ids of a list page, in their order."""
    return re.findall(r'<a href="/reports/([0-9a-f]+)">', page)


async def test_either_replica_lists_both_replicas_requests_and_shows_their_pages(redis_url: str) -> None:
    async with replicas(redis_url) as [(a, a_state), (b, b_state)]:
        first = await a.post("/v1/chat/completions", json=BODY, headers={"x-faithproxy-mode": "detect"})
        second = await b.post("/v1/chat/completions", json=BODY, headers={"x-faithproxy-mode": "off"})
        await b_state.shadow.drained()
        for state in (a_state, b_state):
            await state.reports.store.aclose()  # lets the writes in flight land
        ids = [r.headers["x-faithproxy-request-id"] for r in (first, second)]
        lists = [listed((await http.get("/reports")).text) for http in (a, b)]
        shadow_only = listed((await a.get("/reports", params={"source": "shadow"})).text)
        inline_only = listed((await b.get("/reports", params={"source": "inline", "verdict": "residual"})).text)
        by_key = [listed((await a.get("/reports", params={"key": key})).text) for key in ("default", "other")]
        pages = [await http.get(f"/reports/{rid}") for http, rid in ((b, ids[0]), (a, ids[1]))]
    assert lists == [ids[::-1], ids[::-1]]  # newest first, on both
    assert shadow_only == [ids[1]] and inline_only == [ids[0]]
    assert by_key == [ids[::-1], []]  # no policy file: every request's policy is "default"
    assert [p.status_code for p in pages] == [200, 200]


async def test_the_shared_list_pages_and_filters_in_redis(redis_url: str) -> None:
    store = RedisReportStore(redis_url, max_count=100, max_age_s=60)
    for n in range(7):
        report = {"id": f"r{n}", "model": "m" if n % 2 else "n", "source": "shadow" if n < 3 else "inline", "key": "k"}
        store.put(f"r{n}", report)
        await store.aclose()  # in order: each write lands before the next
    first, more = await store.rows(RowFilter(), 0, 3)
    second, more_after = await store.rows(RowFilter(), 3, 3)
    odd, _ = await store.rows(RowFilter(model="m", source="inline"), 0, 10)
    assert [r["id"] for r in first] == ["r6", "r5", "r4"] and more
    assert [r["id"] for r in second] == ["r3", "r2", "r1"] and more_after
    assert [r["id"] for r in odd] == ["r5", "r3"]
    await store.aclose()


async def test_trimmed_reports_leave_the_list_with_their_rows(redis_url: str) -> None:
    store = RedisReportStore(redis_url, max_count=2, max_age_s=60)
    for n in range(4):
        store.put(f"r{n}", {"id": f"r{n}"})
        await store.aclose()  # in order: each write lands before the next
    rows, more = await store.rows(RowFilter(), 0, 10)
    assert [r["id"] for r in rows] == ["r3", "r2"] and not more
    import redis

    assert sorted(k for k in redis.Redis.from_url(redis_url).keys("faithproxy:report-rows:*")) == [
        b"faithproxy:report-rows:r2",
        b"faithproxy:report-rows:r3",
    ]
    await store.aclose()
