"""Per-step reports by request id (server/observe/reports.py, GET /v1/faithfulness/{request_id}): the store's
bounds, and the lookup through the running proxy (vLLM a MockTransport, the local judge server). The
Redis store (server/observe/reports_redis.py) against a real redis-server started here, stopped and restarted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.observe.reports import ReportStore, ReportsUnavailable, SharedReportStore
from faithproxy.server.observe.reports_redis import INDEX, RedisReportStore
from faithproxy.server.settings import Settings
from faithproxy.testing import SENTENCES, FakeUpstream, as_annotated, frames, running_app
from tests.redis_server import RedisServer

KEY = "fp-client-key-for-reports"
BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}]}
HANG_GUARD_S = 120  # ends a wait on a stopped Redis as a failure; no figure of the test depends on it
# The limit of a call expected to be answered (the judge's, the client's, the Redis store's where Redis is up
# or down, not hung): one no loaded machine reaches; it bounds a hang, it measures nothing.
ANSWERED_S = 30.0


# ---- the store ------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_store_keeps_the_newest_reports_up_to_its_count() -> None:
    store = ReportStore(max_count=2, max_age_s=60)
    for n in range(3):
        store.put(f"r{n}", {"n": n})
    assert store.get("r0") is None
    assert json.loads(store.get("r1") or b"") == {"n": 1} and json.loads(store.get("r2") or b"") == {"n": 2}
    store.put("r1", {"n": 11})  # stored again: now the newest
    store.put("r3", {"n": 3})
    assert store.get("r2") is None and json.loads(store.get("r1") or b"") == {"n": 11}
    assert len(store) == 2


def test_the_store_forgets_reports_older_than_its_age() -> None:
    clock = Clock()
    store = ReportStore(max_count=100, max_age_s=60, clock=clock)
    store.put("old", {})
    clock.now += 30
    store.put("young", {})
    clock.now += 30
    assert store.get("old") == b"{}"  # exactly the age: still kept
    clock.now += 0.5
    assert store.get("old") is None and store.get("young") == b"{}"
    clock.now += 30
    assert store.get("young") is None and len(store) == 0


def test_a_store_of_count_zero_keeps_nothing() -> None:
    store = ReportStore(max_count=0, max_age_s=60)
    store.put("r", {"n": 1})
    assert store.get("r") is None and len(store) == 0


def test_workers_share_reports_through_one_file_with_the_same_bounds(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "reports" / "reports.sqlite3"
    first = SharedReportStore(path, max_count=2, max_age_s=60, clock=clock)  # one worker's
    second = SharedReportStore(path, max_count=2, max_age_s=60, clock=clock)  # another's
    try:
        first.put("a", {"n": 1})
        assert json.loads(second.get("a") or b"") == {"n": 1}  # written by one, read by the other
        second.put("b", {"n": 2})
        first.put("c", {"n": 3})
        assert first.get("a") is None and second.get("b") == b'{"n":2}' and len(first) == 2  # the count
        clock.now += 61
        assert second.get("b") is None and len(second) == 0  # the age
        first.put("a", {"n": 4})  # an id stored again replaces its report
        assert second.get("a") == b'{"n":4}'
    finally:
        first.close()
        second.close()


# ---- through the proxy ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def proxy(tmp_path: Path, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    judge_app = create_judge_app({"unfaithful": [SENTENCES[0].strip()]})  # the first sentence is "wrong"
    async with running_judge_server(judge_app) as judge_url:
        judge = JudgeConfig(name="claude", backend="anthropic", model="judge-model", base_url=judge_url,
                            api_key="sk-test", timeout_s=ANSWERED_S, max_retries=0)  # type: ignore[arg-type]  # fmt: skip
        settings = Settings(upstream_url="http://vllm.test", trace_path=str(tmp_path / "t.jsonl"), judges=[judge],
                            max_retries=0, **overrides)  # fmt: skip
        app = create_app(settings, upstream_transport=FakeUpstream().transport())
        async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=ANSWERED_S) as http:
            yield http


async def lookup(http: httpx.AsyncClient, response: httpx.Response, **kwargs: Any) -> httpx.Response:
    return await http.get(f"/v1/faithfulness/{response.headers['x-faithproxy-request-id']}", **kwargs)


@pytest.mark.parametrize("mode", ["correct", "detect"])
async def test_a_non_streamed_request_s_report_is_its_faithfulness_with_the_step_texts(
    tmp_path: Path, mode: str
) -> None:
    async with proxy(tmp_path) as http:
        response = await http.post("/v1/chat/completions", json=BODY, headers={"x-faithproxy-mode": mode})
        assert response.status_code == 200, response.text
        found = await lookup(http, response)
    assert found.status_code == 200 and found.headers["content-type"] == "application/json"
    report = found.json()
    body = response.json()
    assert report["id"] == response.headers["x-faithproxy-request-id"] == body["id"].removeprefix("chatcmpl-")
    assert report["object"] == "faithfulness.report" and report["outcome"] == "completed" and report["error"] is None
    assert report["model"] == "m" and report["stream"] is False and report["judge"] == "claude"
    assert as_annotated(report["faithfulness"]) == body["faithfulness"]
    steps = report["faithfulness"]["steps"]
    assert [s["text"] for s in steps] == [text.strip() for text in SENTENCES]  # a step's text: its sentence
    assert {s["channel"] for s in steps} == {"content"}
    assert steps[0]["detected"] == "unfaithful"  # the judge's verdict, step by step
    # for the report page: the question, the timings, the judge's reason and the rejected rewrites per step
    assert report["question"] == "What is in the image?"
    assert report["timings"]["duration_s"] > 0 and report["timings"]["verification_s"] >= 0
    assert isinstance(steps[0]["reason"], str) and steps[0]["reason"]
    assert all(isinstance(s["rejected"], list) for s in steps)


async def test_a_streamed_request_s_report_matches_the_last_chunk(tmp_path: Path) -> None:
    async with proxy(tmp_path) as http:
        response = await http.post("/v1/chat/completions", json={**BODY, "stream": True})
        assert response.status_code == 200
        found = await lookup(http, response)
    chunks = [json.loads(f) for f in frames(response.text) if f != "[DONE]"]
    last = chunks[-1]["faithfulness"]
    report = found.json()
    assert report["stream"] is True and report["outcome"] == "completed"
    assert as_annotated(report["faithfulness"]) == last
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert " ".join(s["text"] for s in report["faithfulness"]["steps"]) == content.strip()


@pytest.mark.parametrize("keep", [False, True])
async def test_a_report_keeps_the_images_only_when_the_server_keeps_images(tmp_path: Path, keep: bool) -> None:
    image = "data:image/png;base64,iVBORw0KGgo="
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "What is in the image?"}]
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    async with proxy(tmp_path, reports_keep_images=keep) as http:
        response = await http.post("/v1/chat/completions", json=body)
        report = (await lookup(http, response)).json()
    (kept,) = report["images"]
    assert len(kept["sha256"]) == 64
    assert kept.get("data_url") == (image if keep else None)


async def test_unknown_ids_and_off_mode_requests_are_a_404_in_openai_format(tmp_path: Path) -> None:
    async with proxy(tmp_path) as http:
        off = await http.post("/v1/chat/completions", json=BODY, headers={"x-faithproxy-mode": "off"})
        assert off.status_code == 200 and off.headers["x-faithproxy-request-id"]
        for response in (await lookup(http, off), await http.get("/v1/faithfulness/0123456789abcdef01234567")):
            assert response.status_code == 404
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and error["code"] == "report_not_found"
            assert error["param"] == "request_id" and "mode off" in error["message"]


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "file"])
async def test_only_the_newest_reports_are_kept(tmp_path: Path, shared: bool) -> None:
    path = {"reports_path": str(tmp_path / "reports.sqlite3")} if shared else {}
    async with proxy(tmp_path, reports_max_count=1, **path) as http:
        first = await http.post("/v1/chat/completions", json=BODY)
        second = await http.post("/v1/chat/completions", json=BODY)
        assert (await lookup(http, first)).status_code == 404
        assert (await lookup(http, second)).status_code == 200


async def test_the_lookup_needs_the_same_key_as_the_api(tmp_path: Path) -> None:
    async with proxy(tmp_path, api_keys=[KEY]) as http:
        auth = {"authorization": f"Bearer {KEY}"}
        response = await http.post("/v1/chat/completions", json=BODY, headers=auth)
        assert response.status_code == 200
        refused = await lookup(http, response)
        wrong = await lookup(http, response, headers={"authorization": "Bearer nope"})
        found = await lookup(http, response, headers=auth)
    assert refused.status_code == 401 and wrong.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert found.status_code == 200 and found.json()["id"] == response.headers["x-faithproxy-request-id"]


# ---- shared through Redis -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """An empty, running Redis for each test (a test that stops it has it started again)."""
    if redis_server.child is None:
        redis_server.start()
    redis_server.client().flushall()
    yield redis_server.url
    if redis_server.child is None:
        redis_server.start()


class Errors(list[str]):
    """The operations a store reported failed (what the app counts in its metrics)."""

    def __call__(self, operation: str) -> None:
        self.append(operation)


def redis_keys(url: str) -> list[bytes]:
    return list(redis.Redis.from_url(url).keys("*"))


async def settle(store: RedisReportStore) -> None:
    """Waits for the store's writes in flight (put returns before its write lands)."""
    if store._pending:
        await asyncio.wait(list(store._pending.values()))


async def test_the_redis_store_keeps_the_newest_reports_up_to_its_count(redis_url: str) -> None:
    store = RedisReportStore(redis_url, max_count=2, max_age_s=60, timeout_s=ANSWERED_S)
    try:
        for n in range(3):
            store.put(f"r{n}", {"n": n})
            await settle(store)
        assert await store.fetch("r0") is None
        assert json.loads(await store.fetch("r1") or b"") == {"n": 1}
        store.put("r1", {"n": 11})  # stored again: now the newest
        await settle(store)
        store.put("r3", {"n": 3})
        await settle(store)
        assert await store.fetch("r2") is None and await store.fetch("r1") == b'{"n":11}'
        assert await store.fetch("r3") == b'{"n":3}'
    finally:
        await store.aclose()
    keys = {key.decode() for key in redis_keys(redis_url)}
    rows = {"faithproxy:report-rows:r1", "faithproxy:report-rows:r3"}  # each report's row of the list
    assert keys == {INDEX, "faithproxy:reports:r1", "faithproxy:reports:r3", *rows}  # trimmed ones deleted


async def test_the_redis_store_forgets_reports_older_than_its_age(redis_url: str) -> None:
    """Redis's own clock expires the reports, so no clock can be injected. Each check is made only where
    the run's measured timings show it must hold whatever the machine's pace: a report read back less than
    the age after its write began must be there, one the store has dropped must be gone from the index too.
    A run too slow for its age (its window was not met) is repeated with the age doubled."""
    for age_s in AGES_S:
        if await forgets_by_age(redis_url, age_s):
            return
    pytest.fail(f"no run fitted its timings inside ages up to {AGES_S[-1]} s")


AGES_S = (0.4, 0.8, 1.6, 3.2, 6.4)


async def forgets_by_age(redis_url: str, age_s: float) -> bool:
    """One run with reports living `age_s`: True when every check was made (and held), False when the
    machine was too slow for the run to prove anything."""
    redis.Redis.from_url(redis_url).flushall()
    now = asyncio.get_running_loop().time
    store = RedisReportStore(redis_url, max_count=100, max_age_s=age_s, timeout_s=ANSWERED_S)
    try:
        old_sent = now()  # Redis stores "old" no earlier than this, so keeps it until at least age_s after
        store.put("old", {})
        await settle(store)
        await asyncio.sleep(age_s / 2)
        young_sent = now()
        store.put("young", {})
        await settle(store)
        old_read = await store.fetch("old")
        if now() - old_sent >= age_s:
            return False
        assert old_read == b"{}"
        async with asyncio.timeout(HANG_GUARD_S):  # bounds the wait, measures nothing
            while True:  # Redis expires the key on its own clock: nothing to wait on but the key itself
                if await store.fetch("old") is None:
                    break
                await asyncio.sleep(0.01)
        young_read = await store.fetch("young")
        store.put("newest", {})  # a write also drops expired ids from the index
        await settle(store)
        index = redis.Redis.from_url(redis_url).zrange(INDEX, 0, -1)
        if now() - young_sent >= age_s:
            return False
        assert young_read == b"{}" and index == [b"young", b"newest"]
        return True
    finally:
        await store.aclose()


async def test_a_redis_store_of_count_zero_writes_nothing(redis_url: str) -> None:
    store = RedisReportStore(redis_url, max_count=0, max_age_s=60, timeout_s=ANSWERED_S)
    store.put("r", {"n": 1})
    assert not store._pending and await store.fetch("r") is None
    await store.aclose()
    assert redis_keys(redis_url) == []


async def test_replicas_share_reports_through_redis(redis_url: str) -> None:
    first = RedisReportStore(redis_url, max_count=10, max_age_s=60, timeout_s=ANSWERED_S)  # one replica's
    second = RedisReportStore(redis_url, max_count=10, max_age_s=60, timeout_s=ANSWERED_S)  # another's
    try:
        first.put("a", {"n": 1, "text": "é"})
        await settle(first)
        assert json.loads(await second.fetch("a") or b"") == {"n": 1, "text": "é"}
        # The replica that wrote it reads it back at once: the lookup waits for its own write.
        second.put("b", {"n": 2})
        assert await second.fetch("b") == b'{"n":2}'
    finally:
        await first.aclose()
        await second.aclose()


async def test_redis_down_fails_no_write_and_answers_lookups_unavailable_until_it_is_back(
    redis_server: RedisServer, redis_url: str
) -> None:
    """A stopped Redis refuses the connection at once: every call here is answered (by Redis or by the
    refusal), so none needs a short limit."""
    errors = Errors()
    store = RedisReportStore(redis_url, max_count=10, max_age_s=60, timeout_s=ANSWERED_S, on_error=errors)
    try:
        store.put("before", {"n": 0})
        await settle(store)
        assert await store.fetch("before") == b'{"n":0}' and errors == []  # connected, pooled
        redis_server.stop()
        store.put("during", {"n": 1})  # returns at once; the write fails in its task
        await settle(store)
        assert errors == ["write"]
        with pytest.raises(ReportsUnavailable) as raised:
            await store.fetch("before")
        assert raised.value.status_code == 503 and raised.value.code == "reports_unavailable"
        assert errors == ["write", "read"]
        redis_server.start()  # empty again (nothing persisted); the same store reconnects by itself
        store.put("after", {"n": 2})
        await settle(store)
        assert await store.fetch("after") == b'{"n":2}' and await store.fetch("during") is None
        assert errors == ["write", "read"]
    finally:
        await store.aclose()


async def test_a_hung_redis_holds_up_neither_a_write_nor_a_lookup_beyond_the_timeout(
    redis_server: RedisServer, redis_url: str
) -> None:
    errors = Errors()
    store = RedisReportStore(redis_url, max_count=10, max_age_s=60, timeout_s=0.3, max_pending=2, on_error=errors)
    assert redis_server.child is not None
    process = redis_server.child.process
    try:
        # Connected and pooled before the hang. The store's limit is short (it must end the calls Redis never
        # answers), so a write that a loaded machine made outlast it is not a failure here: it is written
        # again until one lands within it.
        async with asyncio.timeout(HANG_GUARD_S):  # bounds the wait, measures nothing
            while True:
                store.put("warm", {})
                await settle(store)
                if not errors:
                    break
                errors.clear()
        # Hung, not down: SIGSTOP leaves its socket open (connections are accepted by the kernel) and it
        # answers nothing until SIGCONT, however long the store would wait. (CLIENT PAUSE would end on
        # its own clock, and a slow machine could outlast it.)
        process.send_signal(signal.SIGSTOP)
        for n in range(3):
            store.put(f"r{n}", {"n": n})  # the third finds two writes waiting: dropped, counted
        assert errors == ["write"] and [not task.done() for task in store._pending.values()] == [True, True]
        # A store that waited for Redis would wait here until SIGCONT: the guard turns that into a failure
        # (it bounds the wait, it measures nothing).
        with pytest.raises(ReportsUnavailable):
            await asyncio.wait_for(store.fetch("warm"), HANG_GUARD_S)
        await asyncio.wait_for(settle(store), HANG_GUARD_S)
        # Both ended while Redis was still stopped, so by their own timeout: counted, not answered.
        assert errors.count("write") == 3 and errors.count("read") == 1
    finally:
        process.send_signal(signal.SIGCONT)
        await store.aclose()


@pytest.mark.parametrize("url", ["http://redis:6379", "redis://redis:port/0"])
def test_a_url_that_is_no_redis_url_stops_the_start(url: str) -> None:
    with pytest.raises(ValueError, match="FAITHPROXY_REPORTS_URL is not a Redis URL"):
        create_app(Settings(upstream_url="http://vllm.test", reports_url=url))


@pytest.mark.parametrize("mode", ["correct", "detect"])
async def test_through_the_proxy_reports_go_to_redis_and_a_lookup_without_it_is_a_503(
    tmp_path: Path, redis_server: RedisServer, redis_url: str, mode: str
) -> None:
    headers = {"x-faithproxy-mode": mode}
    async with proxy(tmp_path, reports_url=redis_url, reports_timeout_s=ANSWERED_S) as http:
        stored = await http.post("/v1/chat/completions", json=BODY, headers=headers)
        found = await lookup(http, stored)
        assert found.status_code == 200, found.text
        assert as_annotated(found.json()["faithfulness"]) == stored.json()["faithfulness"]
        assert redis_keys(redis_url)  # in Redis, not in the proxy's memory
        redis_server.stop()
        served = await http.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=headers)
        assert served.status_code == 200 and frames(served.text)[-1] == "[DONE]"
        assert '"error"' not in served.text
        unavailable = await lookup(http, stored)
        assert unavailable.status_code == 503
        error = unavailable.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "reports_unavailable"
        metrics = (await http.get("/metrics")).text
        redis_server.start()
        again = await http.post("/v1/chat/completions", json=BODY, headers=headers)
        assert (await lookup(http, again)).status_code == 200
    assert 'faithproxy_report_store_errors_total{operation="write"} 1.0' in metrics
    assert 'faithproxy_report_store_errors_total{operation="read"} 1.0' in metrics
