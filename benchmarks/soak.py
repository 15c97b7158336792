"""Soak: hours-long mixed traffic with faults against `faithproxy serve`, watching that memory, open
files, tasks and event-loop lag stay flat (issue 33). A benchmark, not a CI test.

    .venv/bin/python -m faithproxy.benchmarks.soak [--minutes 30] [--clients 64] [--probe FILE]
        [--vllm-url URL [--storage DIR] | --fake-upstream]

Servers, each its own process: vLLM (CPU) serving the ShapesWorld model (or --vllm-url, or the fake
upstream of `python -m faithproxy.testing` with --fake-upstream), the local pixel judge
(benchmarks/standins/judge_server.py), and the proxy, served as `faithproxy serve` serves it (the
tickless Server, server/admission/connections.py's protocol) by this module's `serve` role, which adds two things
inside the proxy's process: a sampler that writes RSS, open file descriptors, asyncio tasks,
event-loop lag (mean and max overshoot of a 100 ms sleep), the requests in flight and those cancelled
because their client left (server/admission/client_gone.py) as a JSON line every --sample-s, and the
upstream fault injector, a transport under the vLLM client that resets a share of chat calls (before the
answer or after its first bytes).

--clients clients send requests one after another for --minutes, each request a random configuration:
every mode (off, detect, correct) with every detector (none, judge, prompt; probe and cascade with
--probe), streamed or not. With --probe FILE (a probe for the ShapesWorld model, `faithproxy probe
train`; docs/benchmarks.md gives the two commands that make one in about two minutes) vLLM is started
capturing the probe's layers under the probe's model name, and the sampler also counts the
hidden-state files vLLM wrote that nobody read yet.

Faults on the client side, each on a share of requests: a judge that never answers (the `stall` judge,
a socket that accepts and stays silent; its timeout_s is 2), a client that disconnects after the first
bytes of the answer, and a slow upload (headers and part of the body, then silence past the proxy's
body timeout, 10 s here: the proxy answers 408). Clients give up after 120 s (httpx's timeout).

--heap-trim-s sets the proxy's FAITHPROXY_HEAP_TRIM_INTERVAL_S (60, its default; 0 turns the trim off),
--heap-mmap-threshold its FAITHPROXY_HEAP_MMAP_THRESHOLD_BYTES (0: glibc's dynamic threshold),
--malloc-arena-max glibc's MALLOC_ARENA_MAX and --python-malloc the interpreter's PYTHONMALLOC, so that
the allocators' settings can be raced side by side (docs/benchmarks.md); the samples then also count
the trims and the seconds they took. Each sample splits RSS into anonymous and file-backed pages and
reports both allocators: glibc's heap (in use, free, held) and Python's pymalloc arenas.

Every --sample-s it prints the proxy's sample beside the requests done and failed since the last one;
at the end, the least-squares slope of each figure per minute over the samples after --warmup-min and
before the traffic stops
(RSS in MiB/min, descriptors and tasks per minute), next to the spread of the samples, and writes all
samples with --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from faithproxy.server.runtime.heap_trim import mallinfo2

CLIENT_BODY_TIMEOUT_S = 10.0
HIDDEN_STATE_DETECTORS = ["probe", "cascade"]  # need --probe: a vLLM that captures hidden states


def configs(with_probe: bool) -> list[tuple[str, str, bool]]:
    extra = HIDDEN_STATE_DETECTORS if with_probe else []
    return [
        (mode, detector, stream)
        for mode, detectors in (
            ("off", ["none"]),
            ("detect", ["judge", "prompt", *extra]),
            ("correct", ["none", "judge", "prompt", *extra]),
        )
        for detector in detectors
        for stream in (True, False)
    ]


# ---- the proxy's process: the `serve` role --------------------------------------------------------


class ResettingTransport(httpx.AsyncBaseTransport):
    """Under the vLLM client: a share of chat calls fail as a vLLM that dropped the connection would,
    half before any answer, half after the first bytes of the body."""

    def __init__(self, share: float, seed: int = 0) -> None:
        self.inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1024))
        self.share = share
        self.random = random.Random(seed)
        self.resets = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        fault = request.url.path.endswith("/completions") and self.random.random() < self.share
        if fault and self.random.random() < 0.5:
            self.resets += 1
            raise httpx.RemoteProtocolError("injected: connection reset before the answer", request=request)
        response = await self.inner.handle_async_request(request)
        if fault:
            self.resets += 1
            response.stream = _cut(response.stream)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _cut(httpx.AsyncByteStream):  # noqa: N801 - a stream wrapper, named as what it does
    def __init__(self, stream: Any) -> None:
        self.stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            yield chunk[: max(1, len(chunk) // 2)]
            raise httpx.RemoteProtocolError("injected: connection reset mid-answer")

    async def aclose(self) -> None:
        await self.stream.aclose()


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def _heap_mib() -> dict[str, float]:
    """glibc's own count of the heap: bytes handed out (live C and Python allocations, mmapped blocks
    included) and bytes it holds free. RSS that grows while `heap_in_use_mib` stays flat is the
    allocator keeping freed pages (fragmentation), not live objects. Empty where glibc has no mallinfo2."""
    info = mallinfo2()
    if info is None:
        return {}
    mib = 1024 * 1024
    return {
        "heap_in_use_mib": round((info.uordblks + info.hblkhd) / mib, 2),
        "heap_free_mib": round(info.fordblks / mib, 2),
        "heap_from_os_mib": round((info.arena + info.hblkhd) / mib, 2),  # what glibc holds, free or not
    }


def _rss_split_mib() -> dict[str, float]:
    """RSS split into anonymous memory (heaps, Python's arenas, thread stacks) and file-backed pages
    (shared libraries, mapped files): a climb in `rss_file_mib` is mappings, not the allocators."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if line.startswith(("RssAnon:", "RssFile:")))
    return {
        f"{name.lower().replace('rss', 'rss_')}_mib": round(int(value.split()[0]) / 1024, 1)
        for name, value in fields.items()
    }


_PYMALLOC_FIELDS = {
    "# arenas allocated current": "pymalloc_arenas",
    "# bytes in allocated blocks": "pymalloc_used_mib",
    "# bytes in available blocks": "pymalloc_free_blocks_mib",
}


def _pymalloc() -> dict[str, float]:
    """Python's small-object allocator, from sys._debugmallocstats (which writes to the C stderr, so
    file descriptor 2 is pointed at a temporary file for the call). Its 1 MiB arenas are mmapped, not
    malloc'd: neither mallinfo2 nor malloc_trim sees them, and an arena goes back to the OS only when
    every block in it is free. Arenas that climb while `pymalloc_used_mib` stays flat are fragmentation
    in Python's allocator. Empty where the interpreter is not using pymalloc (PYTHONMALLOC=malloc)."""
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as capture:
        sys.stderr.flush()
        os.dup2(capture.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        text = capture.read()
    out: dict[str, float] = {}
    for line in text.splitlines():
        label, _, value = line.partition("=")
        key = _PYMALLOC_FIELDS.get(label.strip())
        if key is not None:
            number = int(value.strip().replace(",", ""))
            out[key] = number if key == "pymalloc_arenas" else round(number / 2**20, 2)
    return out


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def sample_forever(
    path: Path, every_s: float, transport: ResettingTransport, storage: Path | None, app: Any
) -> None:
    """One JSON line per `every_s`: RSS, descriptors, tasks, the loop lag seen meanwhile, and the
    hidden-state files vLLM wrote that nobody read yet (a request the proxy gave up on leaves its file)."""
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    tracing = _Growth() if tracemalloc.is_tracing() else None
    with path.open("a") as out:
        while True:
            lags: list[float] = []
            until = loop.time() + every_s
            while loop.time() < until:
                before = loop.time()
                await asyncio.sleep(0.1)
                lags.append(max(0.0, loop.time() - before - 0.1))
            rss_kib = _rss_kib()
            row = {
                "t_min": round((time.monotonic() - start) / 60, 2),
                "rss_mib": round(rss_kib / 1024, 1),
                "fds": len(os.listdir("/proc/self/fd")),
                "tasks": len(asyncio.all_tasks()),
                "lag_mean_ms": round(statistics.fmean(lags) * 1e3, 2),
                "lag_max_ms": round(max(lags) * 1e3, 1),
                "upstream_resets": transport.resets,
                "py_blocks": sys.getallocatedblocks(),  # live blocks of Python's own allocator
                **_heap_mib(),
                **_rss_split_mib(),
                **_pymalloc(),
                **_proxy_counts(app),
                **_trims(app),
            }
            if storage is not None:
                row["hidden_state_files"] = sum(name.endswith(".safetensors") for name in os.listdir(storage))
            out.write(json.dumps(row) + "\n")
            out.flush()
            if tracing is not None:
                tracing.sample(path.with_suffix(".tracemalloc.txt"), row["t_min"])


def _trims(app: Any) -> dict[str, Any]:
    """The heap trimmer's calls so far (server/runtime/heap_trim.py) and the seconds they took together."""
    trimmer = getattr(app.state, "heap_trimmer", None)
    if trimmer is None or trimmer.trims == 0:
        return {}
    return {"heap_trims": trimmer.trims, "heap_trim_s": round(trimmer.seconds, 3)}


class _Growth:
    """With --tracemalloc: the source lines whose live memory grew most since the first sample (taken
    after the first --sample-s of traffic), appended to a text file beside the samples."""

    def __init__(self) -> None:
        self.first: tracemalloc.Snapshot | None = None

    def sample(self, path: Path, t_min: float) -> None:
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if self.first is None:
            self.first = snapshot
            return
        top = snapshot.compare_to(self.first, "lineno")[:12]
        with path.open("a") as out:
            out.write(f"--- minute {t_min}: growth since the first sample\n")
            out.writelines(f"{stat}\n" for stat in top)


def _proxy_counts(app: Any) -> dict[str, float | None]:
    """Requests in flight in the proxy (more than there are clients: work for clients that left) and
    requests cancelled because their client left, from the app's own metrics."""
    state = getattr(app.state, "faithproxy", None)
    if state is None:
        return {}
    registry = state.metrics.registry
    return {
        "in_flight": registry.get_sample_value("faithproxy_requests_in_flight"),
        "abandoned": registry.get_sample_value("faithproxy_abandoned_requests_total"),
    }


async def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from faithproxy.server.admission.connections import HTTP_PROTOCOL
    from faithproxy.server.app import create_app
    from faithproxy.server.runtime.uvicorn_server import Server
    from faithproxy.server.settings import Settings

    if args.tracemalloc:
        tracemalloc.start(4)  # slows the proxy several-fold: a diagnostic run, not a measurement
    transport = ResettingTransport(args.reset_share)
    app = create_app(Settings(), upstream_transport=transport)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning", http=HTTP_PROTOCOL)
    storage = Path(args.storage) if args.storage else None
    sampler = asyncio.create_task(sample_forever(Path(args.samples), args.sample_s, transport, storage, app))
    try:
        await Server(config).serve()
    finally:
        sampler.cancel()


# ---- the driver -----------------------------------------------------------------------------------


def stall_server() -> tuple[socket.socket, int]:
    """A judge that accepts and never answers (the judge timeout fault): connections wait in the
    listen backlog, accepted by nobody; the proxy's judge client gives up at its timeout_s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    return listener, listener.getsockname()[1]


class Traffic:
    def __init__(self, url: str, model: str, items: list[tuple[str, str]], args: argparse.Namespace) -> None:
        self.url, self.model, self.items, self.args = url, model, items, args
        self.tally: Counter[str] = Counter()
        self.random = random.Random(1)
        self.configs = configs(args.probe is not None)

    def body(self, stream: bool) -> dict[str, Any]:
        question, image = self.random.choice(self.items)
        content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": question}]
        return {
            "model": self.model,
            "stream": stream,
            "max_tokens": 96,
            "messages": [{"role": "user", "content": content}],
        }

    async def client(self, http: httpx.AsyncClient, deadline: float) -> None:
        while time.monotonic() < deadline:
            mode, detector, stream = self.random.choice(self.configs)
            headers = {"x-faithproxy-mode": mode, "x-faithproxy-detector": detector}
            roll = self.random.random()
            try:
                if roll < self.args.slow_upload_share:
                    await self.slow_upload()
                    continue
                stall = roll < self.args.slow_upload_share + self.args.judge_stall_share
                if detector in ("judge", "cascade") and stall:
                    headers["x-faithproxy-judge"] = "stall"
                disconnect = self.random.random() < self.args.disconnect_share
                await self.one(http, headers, self.body(stream), disconnect)
            except (httpx.HTTPError, OSError) as exc:
                self.tally[f"client_error:{type(exc).__name__}"] += 1

    async def one(self, http: httpx.AsyncClient, headers: dict[str, str], body: dict[str, Any], leave: bool) -> None:
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            async for _ in response.aiter_bytes():
                if leave:
                    self.tally["disconnected"] += 1
                    return  # leaving the block closes the connection mid-answer
            self.tally[f"{response.status_code}"] += 1

    async def slow_upload(self) -> None:
        host, port = self.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        raw = json.dumps(self.body(False)).encode()
        head = f"POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\ncontent-length: {len(raw)}\r\n\r\n"
        writer.write(head.encode() + raw[:50])
        try:
            answer = await asyncio.wait_for(reader.read(), CLIENT_BODY_TIMEOUT_S + 30)
            self.tally["slow_upload_" + (answer.split(b" ", 2)[1].decode() if answer else "closed")] += 1
        finally:
            writer.close()


def slopes(samples: list[dict[str, Any]], warmup_min: float, end_min: float) -> dict[str, Any]:
    """Slopes over the samples taken under load: after the warm-up, before the clients stop (the
    sampler's clock starts a little before the traffic's, so `end_min` is the traffic's length)."""
    kept = [s for s in samples if warmup_min <= s["t_min"] <= end_min]
    out: dict[str, Any] = {"samples": len(kept)}
    if len(kept) < 3:
        return out
    t = [s["t_min"] for s in kept]
    late = kept[len(kept) // 2 :]  # the second half: whether a figure levelled off
    for key in (
        "rss_mib",
        "fds",
        "tasks",
        "lag_mean_ms",
        "py_blocks",
        "heap_in_use_mib",
        "heap_free_mib",
        "heap_from_os_mib",
        "rss_anon_mib",
        "rss_file_mib",
        "pymalloc_arenas",
        "pymalloc_used_mib",
    ):
        if not all(key in s for s in kept):
            continue
        ys = [float(s[key]) for s in kept]
        out[key] = {
            **_fit(t, ys),
            "min": min(ys),
            "max": max(ys),
            "stdev": round(statistics.pstdev(ys), 2),
        }
        if len(late) >= 3:
            out[key]["second_half"] = _fit([s["t_min"] for s in late], [float(s[key]) for s in late])
    return out


def _fit(t: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares slope per minute with two standard errors: a slope within ±2 SE of 0 is flat."""
    fit = statistics.linear_regression(t, ys)
    n = len(t)
    mean_t = statistics.fmean(t)
    residual = sum((y - (fit.intercept + fit.slope * x)) ** 2 for x, y in zip(t, ys, strict=True))
    spread_t = sum((x - mean_t) ** 2 for x in t)
    se = (residual / (n - 2) / spread_t) ** 0.5 if n > 2 and spread_t > 0 else float("nan")
    return {"slope_per_min": round(fit.slope, 4), "two_se": round(2 * se, 4)}


async def drive(args: argparse.Namespace, url: str, model: str, samples: Path) -> dict[str, Any]:
    from faithproxy.benchmarks.performance.cpu_per_token import questions

    traffic = Traffic(url, model, questions(32), args)
    deadline = time.monotonic() + args.minutes * 60
    limits = httpx.Limits(max_connections=args.clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits, trust_env=False) as http:
        clients = [asyncio.create_task(traffic.client(http, deadline)) for _ in range(args.clients)]
        seen = 0
        while not all(c.done() for c in clients):
            await asyncio.wait(clients, timeout=args.sample_s)
            lines = _lines(samples)
            for line in lines[seen:]:
                print(f"{line}  requests {dict(sorted(traffic.tally.items()))}", flush=True)
            seen = len(lines)
        for c in clients:
            c.result()
    rows = [json.loads(line) for line in _lines(samples)]
    result = {"samples": rows, "requests": dict(traffic.tally), "slopes": slopes(rows, args.warmup_min, args.minutes)}
    print("slopes after warm-up:", json.dumps(result["slopes"]))
    return result


def start_vllm(workdir: Path, probe: dict[str, Any] | None) -> Any:
    """vLLM serving the ShapesWorld model; with a probe, under the probe's model name and capturing
    the probe's layers into workdir/hidden-states (the proxy reads and deletes the files)."""
    from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
    from faithproxy.benchmarks.tinyvlm import serve

    if probe is None:
        return serve.start_vllm(WEIGHTS_DIR, log_path=workdir / "vllm.log")
    from faithproxy.clients.hidden_states import server_args

    storage = workdir / "hidden-states"
    storage.mkdir()
    return serve.start_vllm(
        WEIGHTS_DIR,
        extra_args=server_args(probe["layers"], str(storage)),
        served_model_name=probe["model"],
        log_path=workdir / "vllm.log",
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])},  # vLLM imports the repo's connector
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from faithproxy.benchmarks.performance.cpu_per_token import start_pixel_judge
    from faithproxy.benchmarks.tinyvlm import processes

    workdir = Path(tempfile.mkdtemp(prefix="faithproxy-soak-"))
    probe = json.loads(Path(args.probe).read_text()) if args.probe else None
    if probe is not None and args.vllm_url and not args.storage:
        raise SystemExit("--probe with --vllm-url needs --storage (the directory that vLLM writes hidden states to)")
    storage = Path(args.storage) if args.storage else workdir / "hidden-states"
    samples = workdir / "samples.jsonl"
    started: list[processes.Child] = []
    stall, stall_port = stall_server()
    with processes.supervised():
        try:
            url = args.vllm_url
            if args.fake_upstream:
                port = processes.free_port()
                argv = [sys.executable, "-m", "faithproxy.testing", "--port", str(port)]
                started.append(processes.spawn(argv, workdir / "upstream.log", name="upstream"))
                url = f"http://127.0.0.1:{port}"
                started[-1].wait_healthy(f"{url}/v1/models", 60)
            elif url is None:
                vllm = start_vllm(workdir, probe)
                started.append(vllm.child)
                url = vllm.base_url
            model = httpx.get(f"{url}/v1/models", trust_env=False).json()["data"][0]["id"]
            judge, judge_url = start_pixel_judge(workdir)
            started.append(judge)
            judge.wait_healthy(f"{judge_url}/_stats", 60)
            judges = [
                {"name": "bench", "backend": "anthropic", "model": "bench", "base_url": judge_url, "api_key": "x"},
                {"name": "stall", "backend": "anthropic", "model": "stall", "base_url": f"http://127.0.0.1:{stall_port}",
                 "api_key": "x", "timeout_s": 2, "max_retries": 0},
            ]  # fmt: skip
            port = processes.free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith("FAITHPROXY_")}
            env |= {
                "FAITHPROXY_UPSTREAM_URL": url,
                "FAITHPROXY_JUDGES": json.dumps(judges),
                "FAITHPROXY_DEFAULT_JUDGE": "bench",
                "FAITHPROXY_CLIENT_BODY_TIMEOUT_S": str(CLIENT_BODY_TIMEOUT_S),
            }
            env["FAITHPROXY_HEAP_TRIM_INTERVAL_S"] = str(args.heap_trim_s)
            if args.heap_mmap_threshold is not None:
                env["FAITHPROXY_HEAP_MMAP_THRESHOLD_BYTES"] = str(args.heap_mmap_threshold)
            if args.malloc_arena_max is not None:
                env["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
            if args.python_malloc is not None:
                env["PYTHONMALLOC"] = args.python_malloc
            if args.reports_max_count is not None:  # the report stores grow until full or an hour old
                env["FAITHPROXY_REPORTS_MAX_COUNT"] = str(args.reports_max_count)
            if probe is not None:
                env |= {"FAITHPROXY_HIDDEN_STATES_LAYERS": json.dumps(probe["layers"]),
                        "FAITHPROXY_PROBE_PATH": str(Path(args.probe).resolve())}  # fmt: skip
            argv = [sys.executable, "-m", "faithproxy.benchmarks.soak", "serve", "--port", str(port)]
            argv += ["--samples", str(samples), "--sample-s", str(args.sample_s)]
            argv += ["--reset-share", str(args.reset_share)]
            if probe is not None:
                argv += ["--storage", str(storage)]
            if args.tracemalloc:
                argv += ["--tracemalloc"]
            started.append(processes.spawn(argv, workdir / "proxy.log", name="faithproxy", env=env))
            proxy_url = f"http://127.0.0.1:{port}"
            started[-1].wait_healthy(f"{proxy_url}/readyz", 60)
            print(f"soak: {args.minutes} min, {args.clients} clients, logs in {workdir}", file=sys.stderr, flush=True)
            return asyncio.run(drive(args, proxy_url, model, samples))
        finally:
            stall.close()
            processes.stop_all(started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", choices=["drive", "serve"], default="drive")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument(
        "--warmup-min", type=float, default=5.0, help="samples before this minute are left out of the slopes"
    )
    parser.add_argument("--vllm-url", help="a running vLLM serving the ShapesWorld model (else one is started)")
    parser.add_argument("--fake-upstream", action="store_true", help="the fake upstream instead of vLLM (a smoke run)")
    parser.add_argument("--reset-share", type=float, default=0.03, help="upstream chat calls reset by the injector")
    parser.add_argument("--judge-stall-share", type=float, default=0.05, help="judge requests sent to the stall judge")
    parser.add_argument("--disconnect-share", type=float, default=0.05, help="requests the client leaves mid-answer")
    parser.add_argument("--slow-upload-share", type=float, default=0.02, help="requests uploaded too slowly (408)")
    parser.add_argument("--probe", help="a probe file for the ShapesWorld model: adds the probe and cascade detectors")
    parser.add_argument("--storage", help="where vLLM writes hidden states (with --probe and --vllm-url)")
    parser.add_argument("--reports-max-count", type=int, help="the proxy's report store size (default: its own)")
    parser.add_argument("--tracemalloc", action="store_true", help="trace the proxy's allocations (diagnostic)")
    parser.add_argument(
        "--heap-trim-s", type=float, default=60.0, help="the proxy's FAITHPROXY_HEAP_TRIM_INTERVAL_S (0: no trims)"
    )
    parser.add_argument(
        "--heap-mmap-threshold",
        type=int,
        help="the proxy's FAITHPROXY_HEAP_MMAP_THRESHOLD_BYTES (default: its own, 128 KiB; 0: glibc's dynamic one)",
    )
    parser.add_argument("--malloc-arena-max", type=int, help="glibc's MALLOC_ARENA_MAX for the proxy's process")
    parser.add_argument(
        "--python-malloc", choices=["malloc", "pymalloc"], help="the proxy's PYTHONMALLOC (default: the interpreter's)"
    )
    parser.add_argument("--out", help="write the samples, request counts and slopes as JSON here")
    parser.add_argument("--port", type=int, help="serve: the proxy's port")
    parser.add_argument("--samples", help="serve: the file the sampler appends to")
    args = parser.parse_args(argv)
    if args.role == "serve":
        asyncio.run(serve(args))
        return 0
    result = run(args)
    result["config"] = {k: v for k, v in vars(args).items() if k not in ("role", "port", "samples", "out")}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
