"""faithproxy in front of vLLM's router (`vllm-router`) in front of two real vLLM replicas of the fixture model.

One module-scoped stack (two replicas, a consistent-hash and a round-robin router, the local judge) is
shared by every test here; the fault test kills a replica, so it runs last. What a replica served is read
from its own /metrics (HTTP calls to the chat endpoint, prefix-cache queries and hits), before and after
each request, so requests are measured one at a time.

- The routing key (x-session-id, one per request) keeps every call of a verified request with rewrites
  on one replica under consistent hash; round robin spreads them. Prefix-cache hit rate: consistent
  hash within 5 points of one replica served directly.
- Generated keys spread requests over both replicas (the smaller gets at least `spread_floor`: 20 of 200).
- A replica that drops calls while it still passes health checks: the router answers 500 in plain
  text; correct mode sends the round again and the client sees no error.
- SIGKILL of one replica under load (8 concurrent verified streams, 40 requests): correct mode shows the
  client no error, every chain ends complete, the resumes are counted; off mode's streams that were on
  the dead replica end with the documented error frame.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.performance import replica_stack as rs
from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.benchmarks.tinyvlm.serve import VLLMServer
from faithproxy.server.app import create_app
from faithproxy.testing import frames, metric, running_app, threaded_app
from tests.conftest import _require
from tests.support import local_judge_settings, proxy_metrics

pytestmark = [pytest.mark.integration]

PER_POLICY = 6  # verified requests with rewrites per routing policy, two per scene
# Short off-mode requests (one token each) for the spread of generated keys. The share each replica gets
# is the ring's (vllm-router's 160 virtual nodes per worker, placed by hashing the worker's URL, whose
# port is random here: about 4 points sd either side of half, so a 60/40 ring is not rare) plus sampling
# noise. The floor is derived, not tuned: the smaller replica's ring share is at least MIN_RING_SHARE
# (6 ring sd below half), its count is then binomial, and the floor sits SPREAD_SDS standard deviations
# below that mean (a false failure well under once in a million runs). Keys that are not generated, or
# one key for all, put every request on one replica: 0 on the other.
SPREAD_REQUESTS = 200
MIN_RING_SHARE, SPREAD_SDS = 0.25, 5
FAULT_REQUESTS, CONCURRENCY = 40, 8
OFF_LONG = {"max_tokens": 600, "ignore_eos": True}  # off streams long enough to be cut by the kill


@dataclass
class Stack:
    replicas: list[VLLMServer]
    routers: dict[str, rs.Router]
    judge_url: str
    nonce: int = int(time.time()) % 100_000 * 100  # images no earlier run of this vLLM has cached

    def next_nonce(self) -> int:
        self.nonce += 1
        return self.nonce


@pytest.fixture(scope="module")
def stack(fixture_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _require("vllm")
    try:
        rs.router_binary()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    logs = tmp_path_factory.mktemp("replicas")
    started = time.perf_counter()
    replicas = rs.start_replicas(fixture_model_dir, 2, logs)
    print(f"\nreplicas: two vLLM replicas up in {time.perf_counter() - started:.1f} s")
    routers: dict[str, rs.Router] = {}
    try:
        for policy in ("consistent_hash", "round_robin"):
            routers[policy] = rs.start_router([r.base_url for r in replicas], policy, logs / f"{policy}.log")
        judge_app = create_judge_app(spec.oracle_json())
        with threaded_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url:
            yield Stack(replicas, routers, judge_url)
    finally:
        for router in routers.values():
            router.stop()
        for replica in replicas:
            replica.stop()


def summary_of(text: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str | None]:
    """The stream's faithfulness summary, its error frames, and its last finish reason."""
    summary, errors, finish = None, [], None
    for data in frames(text)[:-1]:
        chunk = json.loads(data)
        if "error" in chunk:
            errors.append(chunk["error"])
        for choice in chunk.get("choices") or []:
            finish = choice.get("finish_reason") or finish
        summary = chunk.get("faithfulness", summary) if "perception_steps" in chunk.get("faithfulness", {}) else summary
    return summary, errors, finish


async def verified_one_by_one(stack: Stack, upstream: str, count: int) -> tuple[list[rs.Placement], list[rs.Counters]]:
    """`count` verified requests, one at a time, through a proxy in front of `upstream`: where each one's
    calls went, and the replicas' counters over all of them."""
    placements, totals = [], [rs.Counters(), rs.Counters()]
    settings = local_judge_settings(upstream, stack.judge_url)
    async with running_app(create_app(settings)) as url, httpx.AsyncClient(timeout=300) as http:
        for i in range(count):
            before = await rs.read_counters(stack.replicas)
            body = rs.scene_request(rs.SCENES[i % len(rs.SCENES)], stack.next_nonce())
            response = await http.post(f"{url}/v1/chat/completions", json=body)
            after = await rs.read_counters(stack.replicas)
            summary, errors, finish = summary_of(response.text)
            assert response.status_code == 200 and not errors and finish == "stop", response.text[-500:]
            assert summary is not None and summary["regenerations"] >= 1  # a request with rewrites
            spent = [a - b for a, b in zip(after, before, strict=True)]
            placements.append(rs.Placement([c.calls for c in spent]))
            totals = [t + c for t, c in zip(totals, spent, strict=True)]
    return placements, totals


def share_on_one(placements: list[rs.Placement]) -> float:
    """Of all the calls, the share that went to the replica that served most of its request's calls."""
    return sum(max(p.calls) for p in placements) / sum(p.total for p in placements)


async def test_the_routing_key_keeps_a_request_on_one_replica_round_robin_does_not(stack: Stack) -> None:
    ch, ch_totals = await verified_one_by_one(stack, stack.routers["consistent_hash"].base_url, PER_POLICY)
    rr, rr_totals = await verified_one_by_one(stack, stack.routers["round_robin"].base_url, PER_POLICY)
    one, one_totals = await verified_one_by_one(stack, stack.replicas[0].base_url, PER_POLICY)
    rates = {
        name: rs.hit_rate(totals[0] + totals[1])
        for name, totals in (("consistent_hash", ch_totals), ("round_robin", rr_totals), ("one replica", one_totals))
    }
    print(
        f"\nreplicas: calls per request {[p.total for p in ch]}; on one replica: consistent hash "
        f"{share_on_one(ch):.3f}, round robin {share_on_one(rr):.3f}; prefix-cache hit rate "
        + ", ".join(f"{name} {rate:.3f}" for name, rate in rates.items())
    )
    assert all(p.total >= 3 for p in ch + rr + one)  # first round, rewrite, continuation at least
    assert share_on_one(ch) >= 0.95
    assert share_on_one(rr) < 0.95  # without the key's pinning the calls of one request spread
    assert all(p.calls[1] == 0 for p in one)  # the direct run touched replica 0 only
    assert abs(rates["consistent_hash"] - rates["one replica"]) <= 0.05
    assert rates["round_robin"] < rates["consistent_hash"]


async def test_generated_keys_spread_requests_over_both_replicas(stack: Stack) -> None:
    settings = local_judge_settings(stack.routers["consistent_hash"].base_url, stack.judge_url)
    before = await rs.read_counters(stack.replicas)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(http: httpx.AsyncClient, url: str) -> None:
        body = rs.scene_request("red_circle", stack.next_nonce(), max_tokens=1)
        async with gate:
            response = await http.post(f"{url}/v1/chat/completions", json=body, headers={"x-faithproxy-mode": "off"})
        assert response.status_code == 200 and frames(response.text)[-1] == "[DONE]"

    async with running_app(create_app(settings)) as url, httpx.AsyncClient(timeout=300) as http:
        await asyncio.gather(*(one(http, url) for _ in range(SPREAD_REQUESTS)))
    after = await rs.read_counters(stack.replicas)
    counts = [a.calls - b.calls for a, b in zip(after, before, strict=True)]
    print(f"\nreplicas: {SPREAD_REQUESTS} requests with generated keys spread {counts}")
    assert sum(counts) == SPREAD_REQUESTS and min(counts) >= spread_floor(SPREAD_REQUESTS), counts


def spread_floor(n: int, share: float = MIN_RING_SHARE, sds: float = SPREAD_SDS) -> float:
    """The fewest of `n` requests the smaller replica may get: `sds` binomial sd below n * share."""
    return n * share - sds * math.sqrt(n * share * (1 - share))


class ResettingWorker:
    """A replica that passes the router's health checks (every GET: 200) but drops every POST without
    an answer, like a replica dying between two health checks: the router answers such a call 500 in
    plain text ("Request failed: error sending request for url ..."), not 502."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.posts = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            with conn:
                head = conn.recv(65536)
                if head.startswith(b"GET"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                else:
                    self.posts += 1

    def close(self) -> None:
        self.listener.close()


async def test_a_routers_plain_500_for_an_unreachable_replica_is_resumed(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """vllm-router (round robin) over a live replica and one that drops every call: a round the router
    sends to the dead one comes back 500 before its first byte; correct mode sends it again (round robin's
    next pick is the live replica) and the client sees no error. The router's own retries are off: under
    round robin they would hide the 500 (a retry goes to the live replica), under consistent hash they go
    to the same dead replica and the 500 reaches the proxy, as in the kill test below. Scenes without a
    planted error: one round each, no rewrite, so every call the dead replica got was a round."""
    dead = ResettingWorker()
    log = tmp_path_factory.mktemp("router-500") / "router.log"
    router = rs.start_router(
        [stack.replicas[0].base_url, dead.url], "round_robin", log, extra_args=["--disable-retries"]
    )
    settings = local_judge_settings(router.base_url, stack.judge_url)
    try:
        async with running_app(create_app(settings)) as url, httpx.AsyncClient(timeout=300) as http:
            for scene in ("green_circle", "yellow_triangle"):  # one of the two first rounds, at least, is refused
                body = rs.scene_request(scene, stack.next_nonce())
                response = await http.post(f"{url}/v1/chat/completions", json=body)
                summary, errors, finish = summary_of(response.text)
                assert response.status_code == 200 and errors == [] and finish == "stop", response.text[-500:]
                assert summary is not None and summary["regenerations"] == 0
            metrics = await proxy_metrics(url)
    finally:
        router.stop()
        dead.close()
    resumed = metric(metrics, "faithproxy_upstream_resumes_total", outcome="resumed")
    print(f"\nreplicas: calls the dead replica dropped {dead.posts}, resumed {resumed}")
    assert dead.posts >= 1 and resumed == dead.posts
    assert metric(metrics, "faithproxy_upstream_resumes_total", outcome="exhausted") == 0


async def _running(server: VLLMServer) -> float:
    async with httpx.AsyncClient(timeout=5) as http:
        page = (await http.get(f"{server.base_url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith("vllm:num_requests_running")
    )


OFF = {"x-faithproxy-mode": "off"}


async def keys_on(stack: Stack, replica: VLLMServer, http: httpx.AsyncClient, url: str, count: int = 2) -> list[str]:
    """Routing keys the consistent-hash router sends to `replica`, found by sending short requests."""
    found: list[str] = []
    index = stack.replicas.index(replica)
    for _ in range(64):
        key = f"probe-{stack.next_nonce()}"
        before = await rs.read_counters(stack.replicas)
        body = rs.scene_request("red_circle", stack.next_nonce(), max_tokens=1)
        response = await http.post(f"{url}/v1/chat/completions", json=body, headers={**OFF, "x-session-id": key})
        assert response.status_code == 200
        after = await rs.read_counters(stack.replicas)
        if after[index].calls > before[index].calls:
            found.append(key)
        if len(found) == count:
            return found
    raise AssertionError("no routing key hashed to the replica in 64 tries")


async def test_a_replica_killed_mid_stream_costs_correct_mode_nothing(stack: Stack) -> None:
    """Runs last (it leaves one replica)."""
    victim = stack.replicas[1]
    settings = local_judge_settings(stack.routers["consistent_hash"].base_url, stack.judge_url)
    done, gate, results, off_results = 0, asyncio.Semaphore(CONCURRENCY), [], []
    killed = asyncio.Event()

    async def verified(http: httpx.AsyncClient, url: str, i: int) -> None:
        nonlocal done
        body = rs.scene_request(rs.SCENES[i % len(rs.SCENES)], stack.next_nonce())
        async with gate:
            response = await http.post(f"{url}/v1/chat/completions", json=body)
        results.append((response.status_code, *summary_of(response.text)))
        done += 1

    async def off_streams(http: httpx.AsyncClient, url: str, keys: list[str]) -> None:
        """Long off-mode streams on the victim (their keys hash to it), one per key, until the kill."""
        while not killed.is_set():
            bodies = [rs.scene_request("red_circle", stack.next_nonce(), **OFF_LONG) for _ in keys]
            answers = await asyncio.gather(
                *(
                    http.post(f"{url}/v1/chat/completions", json=body, headers={**OFF, "x-session-id": key})
                    for body, key in zip(bodies, keys, strict=True)
                )
            )
            off_results.extend((a.status_code, frames(a.text)) for a in answers)

    async def kill_mid_stream() -> None:
        # More requests running on the victim than its off streams: a verified request's call is among
        # them (a CI run killed it with only the off streams on it, and nothing was left to resume). Once
        # every verified request is done the kill comes anyway, and the resume assertion says so.
        while done < FAULT_REQUESTS and (done < FAULT_REQUESTS // 4 or await _running(victim) <= len(keys)):  # noqa: ASYNC110 - polls a process
            await asyncio.sleep(0.05)
        rs.kill(victim)
        killed.set()

    async with running_app(create_app(settings)) as url, httpx.AsyncClient(timeout=600) as http:
        keys = await keys_on(stack, victim, http, url)
        await asyncio.gather(
            kill_mid_stream(), off_streams(http, url, keys), *(verified(http, url, i) for i in range(FAULT_REQUESTS))
        )
        metrics = await proxy_metrics(url)
    resumed = metric(metrics, "faithproxy_upstream_resumes_total", outcome="resumed")
    exhausted = metric(metrics, "faithproxy_upstream_resumes_total", outcome="exhausted")
    off_cut = [f for status, f in off_results if status == 200 and f[-1] == "[DONE]" and '"error"' in f[-2]]
    print(f"\nreplicas: kill after {FAULT_REQUESTS // 4} requests: resumed {resumed}, exhausted {exhausted}, "
          f"off streams cut {len(off_cut)} of {len(off_results)}")  # fmt: skip
    assert len(results) == FAULT_REQUESTS
    for status, summary, errors, finish in results:
        assert status == 200 and errors == [] and finish == "stop", (status, errors, finish)
        assert summary is not None and summary["perception_steps"] >= 1
        perception = [step for step in summary["steps"] if step["kind"] == "perception"]
        assert all("unchecked_reason" not in step for step in perception)  # verified to its end
    assert resumed >= 1 and exhausted == 0
    # off mode cannot resume what it forwarded: the documented error frame, then [DONE]
    assert off_cut, "no off-mode stream was on the killed replica"
    for data in off_cut:
        assert json.loads(data[-2])["error"]["code"] in ("stream_broken", "stream_truncated")
