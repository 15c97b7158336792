"""Per-step reports in Redis, so that every replica of the proxy answers every lookup.

Several proxy replicas behind a load balancer cannot share a SQLite file (server/observe/reports.py), and a
lookup (`GET /v1/faithfulness/{id}`) may reach any of them. With `FAITHPROXY_REPORTS_URL=redis://...`
each replica writes the reports of the requests it served to one Redis and reads any report from it.

The bounds are the other stores': a report lives `max_age_s` (the key's own expiry), and at most
`max_count` are kept (a sorted set of ids by the time they were stored, read from Redis's clock so that
the replicas need no common one; each write drops the oldest beyond the count). One Lua script does the
write, the expiry and the trim, so two replicas writing at once cannot leave the count exceeded.

Redis is never in the way of a request. A write is a task started when the request finishes (its
stream has ended or its body is built) and bounded by `timeout_s`; a failure is logged and counted
(`on_error("write")`), the request has long been answered. With Redis unreachable or slow, at most
`max_pending` writes wait at once; more are dropped and counted. A lookup that cannot reach Redis
raises ReportsUnavailable (503), not a 404: the report may well exist. The client reconnects by itself
on the next call, so a Redis that comes back is used again without a restart. A lookup on the replica
that wrote the report waits for that write, if it is still in flight; another replica sees it once
the write has landed, a millisecond or so after the response ended.

Every replica lists every replica's reports (GET /reports): beside each report the write stores its row
of the list (a few hundred bytes, with the same expiry and trimmed with it), and `rows` walks the index
from the newest, filtering rows as it goes, up to one page.

The client belongs to the event loop that first used it (redis.asyncio's connections do);
`aclose()`, at the end of the app's lifespan, closes it, and the next use opens a new one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from faithproxy.server.observe.report_page import report_row
from faithproxy.server.observe.reports import ReportsUnavailable, encode

log = logging.getLogger("faithproxy.reports")

PREFIX = "faithproxy:reports:"
INDEX = PREFIX + "index"  # a sorted set: report ids scored by the time they were stored (µs)
ROWS = "faithproxy:report-rows:"  # each report's row of the list (GET /reports), beside it, with its expiry
SCAN_BATCH = 200  # ids read from the index per round trip while a listing looks for its page

# KEYS[1] the index, KEYS[2] the report's key, KEYS[3] its row's; ARGV id, report, max age (ms), max count,
# key prefix, row, row prefix.
# Redis's TIME is the one clock all replicas share. Scores are whole microseconds (exact in a double);
# the index drops those stored more than the age ago, as the key's expiry does. The keys of trimmed
# reports are built here from the prefix (not declared in KEYS): fine on one Redis, not on a Cluster.
_PUT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local age_ms = tonumber(ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'PX', age_ms)
redis.call('SET', KEYS[3], ARGV[6], 'PX', age_ms)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - age_ms * 1000 - 1)
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4])
if over > 0 then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, over - 1)) do
    redis.call('DEL', ARGV[5] .. id, ARGV[7] .. id)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
end
redis.call('PEXPIRE', KEYS[1], age_ms)
return over
"""

# What a call to an unreachable or failing Redis raises: its client's errors, a socket error, our deadline.
_FAILURES = (RedisError, OSError, TimeoutError)


class RedisReportStore:
    """Encoded reports by request id in Redis: at most `max_count`, none older than `max_age_s`.
    `on_error(operation)` is called with "write" or "read" for each call that failed."""

    def __init__(
        self,
        url: str,
        max_count: int,
        max_age_s: float,
        *,
        timeout_s: float = 2.0,
        max_pending: int = 1000,
        on_error: Callable[[str], None] = lambda operation: None,
    ) -> None:
        try:  # a wrong URL stops the start, not the first request's report
            parse_url(url)
        except ValueError as e:
            raise ValueError(f"FAITHPROXY_REPORTS_URL is not a Redis URL: {e}") from None
        self.url = url
        self.max_count = max_count
        self.max_age_s = max_age_s
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self._on_error = on_error
        self._client: Redis | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[str, asyncio.Task[None]] = {}  # writes in flight, by request id
        self._put_script: Any = None

    def _redis(self) -> tuple[Redis, Any]:
        """This event loop's client and its registered write script."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # One retry without backoff: a pooled connection Redis closed (it restarted) fails once,
            # the retry opens a fresh one. More would only stretch the wait when Redis is down.
            self._client = Redis.from_url(
                self.url,
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
                retry=Retry(NoBackoff(), 1),
            )
            self._put_script = self._client.register_script(_PUT)
            self._loop = loop
        return self._client, self._put_script

    def put(self, request_id: str, report: dict[str, Any], row: dict[str, Any] | None = None) -> None:
        """Starts the write and returns at once (called when a request finishes, in the event loop). `row`:
        the report's line in the list (server/observe/report_page.py `report_row`), made here when not given."""
        if self.max_count <= 0:
            return
        if len(self._pending) >= self.max_pending:
            log.warning("report %s not stored: %d writes to Redis already waiting", request_id, len(self._pending))
            self._on_error("write")
            return
        row = report_row(report) if row is None else row
        task = asyncio.get_running_loop().create_task(self._write(request_id, encode(report), encode(row)))
        self._pending[request_id] = task
        task.add_done_callback(lambda done: self._forget(request_id, done))

    def _forget(self, request_id: str, task: asyncio.Task[None]) -> None:
        if self._pending.get(request_id) is task:
            del self._pending[request_id]

    async def _write(self, request_id: str, encoded: bytes, row: bytes) -> None:
        args = [request_id, encoded, max(1, round(self.max_age_s * 1000)), self.max_count, PREFIX, row, ROWS]
        try:
            async with asyncio.timeout(self.timeout_s):
                _, script = self._redis()
                await script(keys=[INDEX, PREFIX + request_id, ROWS + request_id], args=args)
        except _FAILURES as exc:
            log.warning("report %s not stored in Redis: %s", request_id, str(exc) or type(exc).__name__)
            self._on_error("write")

    async def fetch(self, request_id: str) -> bytes | None:
        """The report as JSON bytes; None when it is unknown or has expired. ReportsUnavailable when
        Redis cannot be asked."""
        pending = self._pending.get(request_id)
        if pending is not None:  # written by this replica a moment ago: let the write land first
            await asyncio.wait({pending}, timeout=self.timeout_s)
        try:
            async with asyncio.timeout(self.timeout_s):
                client, _ = self._redis()
                value = await client.get(PREFIX + request_id)
        except _FAILURES as exc:
            log.warning("report %s not read from Redis: %s", request_id, str(exc) or type(exc).__name__)
            self._on_error("read")
            raise ReportsUnavailable(
                "The report store (Redis) cannot be reached; the report may exist, try again shortly.",
                code="reports_unavailable",
            ) from exc
        return None if value is None else bytes(value)

    async def rows(
        self, keep: Callable[[dict[str, Any]], bool], offset: int, limit: int
    ) -> tuple[list[dict[str, Any]], bool]:
        """The rows of every replica's reports, newest first, that `keep` accepts: `limit` of them after the
        first `offset`, and whether more follow. Reads the index in batches, at most the store's count of
        ids; ReportsUnavailable when Redis cannot be asked."""
        out: list[dict[str, Any]] = []
        matched = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                client, _ = self._redis()
                for start in range(0, max(self.max_count, 1), SCAN_BATCH):
                    ids = await client.zrevrange(INDEX, start, start + SCAN_BATCH - 1)
                    if not ids:
                        break
                    for raw in await client.mget([ROWS.encode() + i for i in ids]):
                        if raw is None:  # expired or trimmed since the index was read
                            continue
                        row = json.loads(raw)
                        if not keep(row):
                            continue
                        matched += 1
                        if matched > offset:
                            out.append(row)
                        if len(out) > limit:
                            return out[:limit], True
        except _FAILURES as exc:
            log.warning("report list not read from Redis: %s", str(exc) or type(exc).__name__)
            self._on_error("read")
            raise ReportsUnavailable(
                "The report store (Redis) cannot be reached; try again shortly.", code="reports_unavailable"
            ) from exc
        return out, False

    async def aclose(self) -> None:
        """Lets the writes in flight finish (each is bounded), then closes this loop's client."""
        if self._pending:
            await asyncio.wait(list(self._pending.values()), timeout=self.timeout_s * 2)
        client, loop = self._client, self._loop
        self._client = self._loop = None
        # A client of another (ended) loop cannot be closed from this one; it is simply dropped.
        if client is not None and loop is asyncio.get_running_loop():
            await client.aclose()
