"""`faithproxy serve --workers 2` for real (its own process tree) in front of a fake vLLM: /metrics is
whole (every scrape counts every worker's requests, whichever worker answers it), the trace file holds
one whole line per request, every request's report is found whichever worker a lookup reaches (a
shared report file made by `serve` when none is configured), and trace lines written by several
processes at once never interleave."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from faithproxy.benchmarks.tinyvlm.processes import free_port, spawn
from faithproxy.server.observe.traces import TraceWriter
from faithproxy.testing import FakeUpstream, Sentences, metric, threaded_app

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}], "stream": True}
REQUESTS = 48


def per_worker(folder: Path) -> dict[str, float]:
    """faithproxy_requests_total of each worker, read from its own multiprocess files."""
    counts = {}
    for pid in {f.stem.rsplit("_", 1)[-1] for f in folder.glob("*.db")}:
        alone = folder.parent / f"alone-{pid}"
        alone.mkdir()
        for f in folder.glob(f"*_{pid}.db"):
            shutil.copy(f, alone / f.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        counts[pid] = metric(generate_latest(registry).decode(), "faithproxy_requests_total", mode="off")
    return counts


async def test_two_workers_export_one_whole_metrics_view_and_one_trace_file(tmp_path: Path) -> None:
    vllm = FakeUpstream(Sentences.repeating(4, gap_s=0.05))  # streams that overlap, so both workers get some
    folder, traces = tmp_path / "metrics", tmp_path / "traces.jsonl"
    port = free_port()
    with threaded_app(vllm, on_exit=vllm.release) as upstream:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAITHPROXY_")}
        env |= {"PROMETHEUS_MULTIPROC_DIR": str(folder), "FAITHPROXY_DEFAULT_DETECTOR": "none"}
        argv = [sys.executable, "-m", "faithproxy.cli", "serve", "--workers", "2", "--upstream", upstream]
        argv += ["--port", str(port), "--traces", str(traces), "--log-level", "warning"]
        child = spawn(argv, tmp_path / "serve.log", name="faithproxy --workers 2", env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            await asyncio.to_thread(child.wait_healthy, f"{url}/healthz", 60)

            async def one() -> int:
                async with httpx.AsyncClient(timeout=30) as http:  # a connection of its own
                    response = await http.post(
                        f"{url}/v1/chat/completions", json=BODY, headers={"x-faithproxy-mode": "off"}
                    )
                    return response.status_code

            statuses = await asyncio.gather(*(one() for _ in range(REQUESTS)))
            assert statuses == [200] * REQUESTS
            scrapes = []
            for _ in range(8):
                async with httpx.AsyncClient(timeout=10) as http:
                    scrapes.append((await http.get(f"{url}/metrics")).text)
            counts = per_worker(folder)
            idle_wakeups = await asyncio.to_thread(main_thread_wakeups, child.process.pid, 1.5)
        finally:
            child.stop()
    assert [metric(s, "faithproxy_requests_total", mode="off", status="2xx") for s in scrapes] == [REQUESTS] * 8
    assert all(metric(s, "faithproxy_requests_in_flight") == 0 for s in scrapes)
    served = {pid: n for pid, n in counts.items() if n}
    assert len(served) == 2 and sum(served.values()) == REQUESTS, counts  # both served, none counted twice
    records = [json.loads(line) for line in traces.read_text().splitlines()]
    assert len(records) == REQUESTS and all(r["mode"] == "off" and r["error"] is None for r in records)
    assert len({r["id"] for r in records}) == REQUESTS
    # Each worker's event loop sleeps until there is work: uvicorn's own Server woke it every 100 ms
    # (15 times in these 1.5 s); only the supervisor's health check, answered by another thread, remains.
    assert len(idle_wakeups) == 2 and all(n < 5 for n in idle_wakeups.values()), idle_wakeups


def main_thread_wakeups(supervisor: int, seconds: float) -> dict[int, int]:
    """Voluntary context switches of each worker's main thread (the event loop's) over `seconds`."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    workers = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]

    def switches(pid: int) -> int:
        status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
        return int(status.split("voluntary_ctxt_switches:")[1].split()[0])

    before = {pid: switches(pid) for pid in workers}
    time.sleep(seconds)
    return {pid: switches(pid) - n for pid, n in before.items()}


async def test_workers_share_one_report_file_when_none_is_configured(tmp_path: Path) -> None:
    vllm = FakeUpstream()
    port = free_port()
    with threaded_app(vllm, on_exit=vllm.release) as upstream:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAITHPROXY_")}
        env |= {"FAITHPROXY_DEFAULT_DETECTOR": "none", "TMPDIR": str(tmp_path)}  # no FAITHPROXY_REPORTS_PATH
        argv = [sys.executable, "-m", "faithproxy.cli", "serve", "--workers", "2", "--upstream", upstream]
        child = spawn(
            [*argv, "--port", str(port), "--log-level", "warning"], tmp_path / "serve.log", name="serve", env=env
        )
        try:
            url = f"http://127.0.0.1:{port}"
            await asyncio.to_thread(child.wait_healthy, f"{url}/healthz", 60)
            folders = _report_folders(tmp_path)
            assert len(folders) == 1 and (folders[0] / "reports.sqlite").exists()

            async def fresh(method: str, path: str, **kwargs: object) -> httpx.Response:
                async with httpx.AsyncClient(timeout=30) as http:  # a connection of its own: any worker
                    return await http.request(method, f"{url}{path}", **kwargs)  # type: ignore[arg-type]

            body = {**BODY, "stream": False}
            answers = await asyncio.gather(
                *(
                    fresh("POST", "/v1/chat/completions", json=body, headers={"x-faithproxy-mode": "correct"})
                    for _ in range(8)
                )
            )
            assert [a.status_code for a in answers] == [200] * 8
            ids = [a.headers["x-faithproxy-request-id"] for a in answers]
            lookups = await asyncio.gather(*(fresh("GET", f"/v1/faithfulness/{i}") for i in ids for _ in range(3)))
            assert [r.status_code for r in lookups] == [200] * 24
            assert {r.json()["id"] for r in lookups} == set(ids)
        finally:
            child.stop()
    assert not _report_folders(tmp_path)  # removed when serve stopped


def _report_folders(parent: Path) -> list[Path]:
    return list(parent.glob("faithproxy-reports-*"))


def _write_records(path: str, writer_id: int, count: int, size: int) -> None:
    writer = TraceWriter(path)
    for i in range(count):
        writer.write({"id": f"{writer_id}-{i}", "prompt": str(writer_id) * size})


@pytest.mark.parametrize("size", [100, 70_000])  # under PIPE_BUF, and far over it and over a page
def test_trace_lines_from_several_processes_never_interleave(tmp_path: Path, size: int) -> None:
    path = tmp_path / "t.jsonl"
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_write_records, args=(str(path), n, 40, size)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 160
    assert {r["id"] for r in records} == {f"{n}-{i}" for n in range(4) for i in range(40)}
    assert all(r["prompt"] == r["id"].split("-")[0] * size for r in records)
