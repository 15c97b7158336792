"""The compose stack's `scale-out` profile in Docker: two proxies, the router, two vLLM containers, Redis.

Run by scripts/stack_scale_out.sh (it sets FAITHPROXY_STACK_SCALE_OUT=1); otherwise skipped: five
containers with two vLLM engines on two cores take longer than CI's budget allows beside the `cpu`
profile (deploy/README.md). Host networking and 127.0.0.1 ports as in test_stack_cpu.py
(tests.deploy.host_stack); Debian's Redis stands in for the official image through REDIS_IMAGE.

- A report written through faithproxy-a is read through faithproxy-b (both on one Redis).
- A vLLM container killed mid-chain (SIGKILL, `docker kill`) costs the client of a verified stream
  nothing: every verified stream ends complete, without an error frame, and the proxies count resumes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.performance import replica_stack as rs
from faithproxy.testing import frames, metric
from tests.deploy.docker_env import build_images, require_docker
from tests.deploy.host_stack import HostStack, Ports, render

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(3600),  # image builds and vLLM starts in the fixture: tens of minutes on a busy machine
    pytest.mark.skipif(
        os.environ.get("FAITHPROXY_STACK_SCALE_OUT") != "1",
        reason="the scale-out stack runs from scripts/stack_scale_out.sh (FAITHPROXY_STACK_SCALE_OUT=1)",
    ),
]

SERVICES = ["faithproxy-a", "faithproxy-b"]  # and what they depend on: router, both vLLMs, Redis, judge
REQUESTS, CONCURRENCY = 24, 6


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostStack]:
    require_docker()
    build_images("proxy", "vllm-cpu", "vllm-router", "redis")
    workdir = tmp_path_factory.mktemp("stack-scale-out")
    ports = Ports.free()
    stack = HostStack(render("scale-out", workdir, ports), "scale-out", f"faithproxy-test-so-{os.getpid()}", ports)
    try:
        stack.up(SERVICES, timeout=1200)
        stack.wait_ready(f"{stack.url('faithproxy')}/readyz")
        stack.wait_ready(f"{stack.url('faithproxy_b')}/readyz")
        yield stack
    finally:
        stack.down()
        left = stack.leftovers()
        assert not left, f"`down -v` left {left} of project {stack.project}"


def summary_of(text: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str | None]:
    """The stream's faithfulness summary, its error frames, and its last finish reason."""
    summary, errors, finish = None, [], None
    for data in frames(text)[:-1]:
        chunk = json.loads(data)
        if "error" in chunk:
            errors.append(chunk["error"])
        for choice in chunk.get("choices") or []:
            finish = choice.get("finish_reason") or finish
        found = chunk.get("faithfulness") or {}
        summary = found if "perception_steps" in found else summary
    return summary, errors, finish


def test_a_report_written_through_one_proxy_is_read_through_the_other(stack: HostStack) -> None:
    body = rs.scene_request("red_circle", 1)
    with httpx.Client(timeout=300) as http:
        response = http.post(f"{stack.url('faithproxy')}/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        request_id = response.headers["x-faithproxy-request-id"]
        summary, errors, _ = summary_of(response.text)
        # The report's write to Redis starts as the stream ends: the writing proxy's own lookup waits for
        # it to land, and only then can the other proxy find it (read at once, it raced the write).
        own = http.get(f"{stack.url('faithproxy')}/v1/faithfulness/{request_id}")
        assert own.status_code == 200, own.text
        report = http.get(f"{stack.url('faithproxy_b')}/v1/faithfulness/{request_id}")
    assert errors == [] and summary is not None
    assert report.status_code == 200, report.text
    stored = report.json()
    assert stored["id"] == request_id
    assert stored["faithfulness"]["perception_steps"] == summary["perception_steps"]
    assert stored["faithfulness"]["unfaithful_detected"] == summary["unfaithful_detected"] == 1


def _running(port: int) -> float:
    page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith("vllm:num_requests_running")
    )


async def test_a_vllm_container_killed_mid_chain_costs_the_client_nothing(stack: HostStack) -> None:
    """Runs last (it leaves one vLLM replica)."""
    victim = stack.compose("ps", "-q", "vllm-b").stdout.strip()
    assert victim, "no vllm-b container"
    done, gate, results = 0, asyncio.Semaphore(CONCURRENCY), []
    proxies = [stack.url("faithproxy"), stack.url("faithproxy_b")]

    async def verified(http: httpx.AsyncClient, i: int) -> None:
        nonlocal done
        body = rs.scene_request(rs.SCENES[i % len(rs.SCENES)], 100 + i)
        async with gate:
            response = await http.post(f"{proxies[i % 2]}/v1/chat/completions", json=body)
        results.append((response.status_code, *summary_of(response.text)))
        done += 1

    async def kill_mid_chain() -> None:
        # Once a quarter of the requests are done, as soon as the victim is serving one: SIGKILL.
        while done < REQUESTS and (done < REQUESTS // 4 or await asyncio.to_thread(_running, stack.ports.vllm_b) < 1):  # noqa: ASYNC110 - polls a container
            await asyncio.sleep(0.05)
        killed = await asyncio.to_thread(
            subprocess.run, ["docker", "kill", victim], capture_output=True, text=True, timeout=60
        )
        assert killed.returncode == 0, killed.stderr

    async with httpx.AsyncClient(timeout=900) as http:
        await asyncio.gather(kill_mid_chain(), *(verified(http, i) for i in range(REQUESTS)))
        pages = [(await http.get(f"{url}/metrics")).text for url in proxies]
    resumed = sum(metric(p, "faithproxy_upstream_resumes_total", outcome="resumed") for p in pages)
    exhausted = sum(metric(p, "faithproxy_upstream_resumes_total", outcome="exhausted") for p in pages)
    print(f"\nscale-out: vllm-b killed after {REQUESTS // 4}+ requests: resumed {resumed}, exhausted {exhausted}")
    assert len(results) == REQUESTS
    for status, summary, errors, finish in results:
        assert status == 200 and errors == [] and finish == "stop", (status, errors, finish)
        assert summary is not None and summary["perception_steps"] >= 1
        perception = [step for step in summary["steps"] if step["kind"] == "perception"]
        assert all("unchecked_reason" not in step for step in perception)  # verified to its end
    assert resumed >= 1 and exhausted == 0, "no verified stream was on the killed container when it died"
