"""Two faithproxy replicas share their reports through one real Redis (FAITHPROXY_REPORTS_URL).

Separate processes, started and stopped by tinyvlm.processes: the session's real vLLM serving the
fixture model, the local judge (the fixture model's oracle), a redis-server on a free 127.0.0.1 port
(Debian's, scripts/install_redis.sh) and two `faithproxy serve` on two ports, which share nothing but
Redis. 100 verified requests go through one replica; every report is read through the other. Then
Redis is stopped: requests are still served, lookups answer 503, the counters of failed writes and
reads move. Then Redis is started again (empty: nothing is persisted) and the replicas use it again,
without a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.benchmarks.tinyvlm.processes import free_port
from faithproxy.testing import as_annotated, metric
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 100
CONCURRENCY = 8
FIXTURES = ("red_circle", "blue_square", "green_circle")  # a planted error, a failing rewrite, a clean chain
ERRORS = "faithproxy_report_store_errors_total"


@dataclass
class Replicas:
    first: str  # the replica requests go through
    second: str  # the replica reports are read through
    model: str
    redis: RedisServer
    children: list[processes.Child]

    def logs(self) -> str:
        """The tail of each process's log, for a failing assertion's message."""
        return "\n".join(f"--- {child.name}:\n{child.log_tail(3000)}" for child in self.children)


@pytest.fixture(scope="module")
def replicas(vllm_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    work = tmp_path_factory.mktemp("replicas")
    redis = RedisServer(work)
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("FAITHPROXY_")}
    clean |= {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    (work / "oracle.json").write_text(json.dumps(spec.oracle_json()))
    ports = {name: free_port() for name in ("judge", "first", "second")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    judges = [{"name": "claude", "backend": "anthropic", "model": "judge", "base_url": urls["judge"], "api_key": "j",
               "timeout_s": 10, "max_retries": 0}]  # fmt: skip
    proxy_env = clean | {
        "FAITHPROXY_JUDGES": json.dumps(judges),
        "FAITHPROXY_REGENERATION_TEMPERATURE": "0.0",  # the fixture model is trained for greedy decoding
        "FAITHPROXY_REPORTS_URL": redis.url,
        # Generous: on a shared CI machine the event loop itself may stall for a while. The bound on a
        # Redis call is proven in tests/server/test_reports.py; here it must not turn load into 503s.
        "FAITHPROXY_REPORTS_TIMEOUT_S": "5",
    }
    py = sys.executable
    with processes.supervised():  # whatever happens here, nothing is left running
        redis.start()
        children = [
            processes.spawn([py, "-m", "faithproxy.benchmarks.standins.judge_server", "--port", str(ports["judge"]),
                             "--oracle", str(work / "oracle.json")], work / "judge.log", name="judge", env=clean),
        ] + [
            processes.spawn([py, "-m", "faithproxy.cli", "serve", "--upstream", vllm_server.base_url, "--port",
                             str(ports[name]), "--log-level", "warning"], work / f"{name}.log",
                            name=f"faithproxy {name}", env=proxy_env, cwd=ROOT)
            for name in ("first", "second")
        ]  # fmt: skip
        try:
            children[0].wait_healthy(f"{urls['judge']}/_stats", 60)
            for child, name in zip(children[1:], ("first", "second"), strict=True):
                child.wait_healthy(f"{urls[name]}/readyz", 90)
            yield Replicas(urls["first"], urls["second"], vllm_server.model, redis, children)
        finally:
            processes.stop_all([*children])
            redis.stop()


def body(fixture: str, model: str) -> dict[str, Any]:
    f = spec.get(fixture)
    content = [
        {"type": "image_url", "image_url": {"url": spec.data_url(fixture)}},
        {"type": "text", "text": f.question},
    ]
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 200, "temperature": 0.0}


async def send(http: httpx.AsyncClient, replicas: Replicas, count: int) -> list[httpx.Response]:
    """`count` verified requests through the first replica, CONCURRENCY at a time: detect, and every
    tenth one correct (its planted step rewritten: more upstream calls, a longer report)."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(n: int) -> httpx.Response:
        mode = "correct" if n % 10 == 0 else "detect"
        async with gate:
            return await http.post(
                f"{replicas.first}/v1/chat/completions",
                json=body(FIXTURES[n % len(FIXTURES)], replicas.model),
                headers={"x-faithproxy-mode": mode},
            )

    responses = await asyncio.gather(*(one(n) for n in range(count)))
    for response in responses:
        assert response.status_code == 200, response.text
        assert response.json()["faithfulness"]["steps"], "a verified request's response carries its steps"
    return responses


async def lookups(http: httpx.AsyncClient, url: str, responses: list[httpx.Response]) -> list[httpx.Response]:
    """Each response's report through the replica at `url`, CONCURRENCY at a time."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(response: httpx.Response) -> httpx.Response:
        async with gate:
            return await http.get(f"{url}/v1/faithfulness/{response.headers['x-faithproxy-request-id']}")

    return list(await asyncio.gather(*(one(r) for r in responses)))


async def landed(http: httpx.AsyncClient, replicas: Replicas, responses: list[httpx.Response]) -> None:
    """Waits until the first replica's report writes for `responses` have landed in Redis. A write starts
    as a request ends and runs on (server/observe/reports_redis.py), so another replica finds the report
    only once it has landed; the writing replica's own lookup waits for its write, which makes that the
    event to wait on (a lookup through the second replica at once raced the write and found nothing)."""
    first = await lookups(http, replicas.first, responses)
    assert [r.status_code for r in first] == [200] * len(responses), replicas.logs()


async def errors(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    text = (await http.get(f"{url}/metrics")).text
    return {op: metric(text, ERRORS, operation=op) for op in ("write", "read")}


async def test_reports_written_by_one_replica_are_read_through_the_other_and_redis_may_go_away(
    replicas: Replicas,
) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        # 1. Redis up: every report of the first replica's requests is read through the second.
        started = time.monotonic()
        served = await send(http, replicas, REQUESTS)
        print(f"{REQUESTS} verified requests through one replica: {time.monotonic() - started:.1f} s")
        await landed(http, replicas, served)
        found = await lookups(http, replicas.second, served)
        assert [r.status_code for r in found] == [200] * REQUESTS, replicas.logs()
        for response, report in zip(served, found, strict=True):
            assert report.json()["id"] == response.headers["x-faithproxy-request-id"]
            assert as_annotated(report.json()["faithfulness"]) == response.json()["faithfulness"]
        assert {r.json()["faithfulness"]["mode"] for r in found} == {"detect", "correct"}
        assert await errors(http, replicas.first) == await errors(http, replicas.second) == {"write": 0, "read": 0}

        # 2. Redis stopped: requests still succeed, lookups answer 503 (not 404), failures are counted.
        replicas.redis.stop()
        during = await send(http, replicas, CONCURRENCY)
        unavailable = await lookups(http, replicas.second, [*served[:4], *during])
        assert [r.status_code for r in unavailable] == [503] * (4 + CONCURRENCY)
        assert {r.json()["error"]["code"] for r in unavailable} == {"reports_unavailable"}
        assert await errors(http, replicas.first) == {"write": CONCURRENCY, "read": 0}
        assert await errors(http, replicas.second) == {"write": 0, "read": 4 + CONCURRENCY}

        # 3. Redis back (empty, like a cache node that restarted): the same processes use it again.
        replicas.redis.start()
        after = await send(http, replicas, CONCURRENCY)
        await landed(http, replicas, after)
        again = await lookups(http, replicas.second, after)
        assert [r.status_code for r in again] == [200] * CONCURRENCY
        assert [r.json()["id"] for r in again] == [r.headers["x-faithproxy-request-id"] for r in after]
        lost = await lookups(http, replicas.second, served[:1])
        assert lost[0].status_code == 404  # written before the restart: gone with Redis's memory
        assert await errors(http, replicas.first) == {"write": CONCURRENCY, "read": 0}
        assert await errors(http, replicas.second) == {"write": 0, "read": 4 + CONCURRENCY}
