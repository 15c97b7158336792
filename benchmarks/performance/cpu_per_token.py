"""Proxy CPU per completion token, per mode, in front of real vLLM.

    .venv/bin/python -m faithproxy.benchmarks.performance.cpu_per_token [--requests 64 --concurrency 8 \\
        --baseline SITE --json out.json]

vLLM (CPU) serves the ShapesWorld model (benchmarks/shapesworld/model/weights; `--model-dir` for another, e.g. the
fixture model var/models/fixture-vlm; `--vllm-url` for one already running); the local judge
(benchmarks/standins/judge_server.py, `--shapesworld`: it reads the image's pixels) runs in its own
process, and so does each proxy (`faithproxy serve`), so the CPU time of a proxy's process is the
proxy's own: the judge's work is not in it, the judge client's (building prompts, the SDK, parsing
replies) is.

Configurations, each `--requests` ShapesWorld held-out questions with their image at `--concurrency`,
streamed and not: `off`; `correct` with detector `none` (the whole correction loop, no checks);
`correct` with the judge; `detect` with the judge. Between batches the proxy's CPU time is read
from its POSIX CPU clock (nanoseconds; /proc's ticks where there is none); a configuration's figure
is that CPU time over the completion tokens its responses report (`usage`: every round's tokens,
regenerations' rounds included). The judge client's share is reported separately: judge-mode CPU
per token minus `correct`/`none`'s, and per judge call.
Batches run in rounds of `--rounds`, the order of configurations rotating, so drift hits all alike.

`--profile DIR` attaches py-spy (`pip install py-spy`) to each proxy for the measured rounds and writes
DIR/<proxy>.svg (a flame graph) and DIR/<proxy>.txt (collapsed stacks, for
benchmarks/performance/profile_breakdown.py); sampling costs the proxy some CPU, so a profiled run's
figures are not for comparison.

`--baseline SITE` also runs the faithproxy installed in SITE (`pip install --no-deps --target SITE
<checkout>`) as a second proxy in front of the same vLLM and judge, batch for batch: before and after in
one run (`--after-site SITE` runs the other side from an installed copy as well: installed the same way,
the two sides differ only by their code). The pair is compared (`comparison`) only when the 1-minute
load was under `--max-load` at the start and again `--settle-s` after the run's own processes stopped
(nothing else ran beside it); the run first waits for it to fall. `--stream-interval N` starts vLLM
sending N tokens per frame. The judge is the stand-in over the OpenAI protocol unless `--judge-backend
anthropic`, and the result holds issue 49's goals (`goals`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.evaluation.heldout import now
from faithproxy.benchmarks.evaluation.shapesworld_bench import git_commit
from faithproxy.benchmarks.performance.overhead_client import cpu_seconds
from faithproxy.benchmarks.tinyvlm import processes

# Issue 49's goals: µs of proxy CPU per streamed completion token, by configuration; and detect, which does
# less than correct, may cost no more than it.
GOALS_US = {"off/none stream": 40.0, "correct/judge stream": 120.0, "detect/judge stream": 150.0}
# A before/after pair is compared only when the machine was quiet: the load average moved the figures
# more than the changes did when other work ran beside a run (issue 49).
MAX_LOAD = 1.5


@dataclass(frozen=True)
class Config:
    mode: str
    detector: str
    stream: bool

    @property
    def name(self) -> str:
        return f"{self.mode}/{self.detector} {'stream' if self.stream else 'non-stream'}"

    @property
    def headers(self) -> dict[str, str]:
        return {"x-faithproxy-mode": self.mode, "x-faithproxy-detector": self.detector}

    @property
    def uses_judge(self) -> bool:
        return self.detector == "judge"

    @property
    def key(self) -> str:
        """How --configs names it: mode/detector/stream or mode/detector/non-stream."""
        return f"{self.mode}/{self.detector}/{'stream' if self.stream else 'non-stream'}"


CONFIGS = [
    Config(mode, detector, stream)
    for mode, detector in (("off", "none"), ("correct", "none"), ("correct", "judge"), ("detect", "judge"))
    for stream in (True, False)
]


def kernel_seconds(pid: int) -> float | None:
    """The process's CPU time spent in the kernel (socket reads and writes, epoll), from /proc's
    ticks; None where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")  # stime: field 15 of stat, 13 after the name


@dataclass
class Tally:
    cpu_s: float = 0.0
    kernel_s: float = 0.0
    wall_s: float = 0.0
    tokens: int = 0
    requests: int = 0
    errors: int = 0
    judge_calls: int = 0
    examples: list[str] = field(default_factory=list)

    def per_token_us(self) -> float | None:
        return round(self.cpu_s / self.tokens * 1e6, 1) if self.tokens else None

    def idle_share_us(self, idle_cpu_per_s: float | None) -> float | None:
        """What the proxy would have spent over the batch's wall time serving nothing, per token."""
        if idle_cpu_per_s is None or not self.tokens:
            return None
        return round(idle_cpu_per_s * self.wall_s / self.tokens * 1e6, 1)


@dataclass
class Proxy:
    name: str
    url: str
    child: processes.Child


def select(keys: str | None) -> list[Config]:
    """The configurations --configs names (comma-separated keys, a `mode/detector` key meaning both
    streamed and not), in CONFIGS' order; all of them without --configs."""
    if not keys:
        return list(CONFIGS)
    wanted = {k.strip() for k in keys.split(",") if k.strip()}
    chosen = [c for c in CONFIGS if c.key in wanted or f"{c.mode}/{c.detector}" in wanted]
    known = {c.key for c in CONFIGS} | {f"{c.mode}/{c.detector}" for c in CONFIGS}
    if unknown := wanted - known:
        raise SystemExit(f"--configs: unknown {sorted(unknown)}; known: {sorted(known)}")
    return chosen


def questions(count: int) -> list[tuple[str, str]]:
    """(question, image data URL) pairs: ShapesWorld held-out items."""
    from faithproxy.benchmarks.shapesworld.model.evaluate import data_url
    from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items

    return [(item.question.prompt, data_url(item.scene)) for item in heldout_items(count)]


def request_body(model: str, question: str, image: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "stream": stream,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": question}],
            }
        ],
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def one(http: httpx.AsyncClient, url: str, config: Config, body: dict[str, Any]) -> tuple[int, str | None]:
    """Completion tokens of one request (from `usage`), or the error that replaced them."""
    try:
        if not config.stream:
            response = await http.post(f"{url}/v1/chat/completions", json=body, headers=config.headers)
            if response.status_code != 200:
                return 0, f"HTTP {response.status_code}: {response.text[:200]}"
            return int(response.json()["usage"]["completion_tokens"]), None
        tokens, done = 0, False
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body, headers=config.headers) as response:
            if response.status_code != 200:
                await response.aread()
                return 0, f"HTTP {response.status_code}: {response.text[:200]}"
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return 0, f"error frame: {str(chunk['error'])[:200]}"
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
        return (tokens, None) if done else (0, "stream ended without [DONE]")
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"[:200]


async def batch(
    http: httpx.AsyncClient, proxy: Proxy, config: Config, bodies: Sequence[dict[str, Any]], concurrency: int
) -> Tally:
    """The bodies through one proxy at `concurrency`; the proxy's CPU time over the batch."""
    pending = list(bodies)
    tally = Tally()

    async def worker() -> None:
        while pending:
            body = pending.pop()
            tokens, error = await one(http, proxy.url, config, body)
            tally.requests += 1
            tally.tokens += tokens
            if error is not None:
                tally.errors += 1
                if len(tally.examples) < 3:
                    tally.examples.append(error)

    pid = proxy.child.process.pid
    before, kernel_before, started = cpu_seconds(pid), kernel_seconds(pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await asyncio.sleep(0.2)  # the proxy writes traces and counts after the last byte
    tally.cpu_s = cpu_seconds(pid) - before
    kernel_after = kernel_seconds(pid)
    if kernel_before is not None and kernel_after is not None:
        tally.kernel_s = kernel_after - kernel_before
    tally.wall_s = time.perf_counter() - started
    return tally


async def idle_cpu(proxies: list[Proxy], seconds: float) -> dict[str, float]:
    """Each proxy's CPU seconds per second while it serves nothing (its event loop's own wake-ups):
    part of every figure, and a large part when the upstream is slow (few tokens per second)."""
    pids = {p.name: p.child.process.pid for p in proxies}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    await asyncio.sleep(seconds)
    return {name: (cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}


async def judge_requests(http: httpx.AsyncClient, judge_url: str) -> int:
    return int((await http.get(f"{judge_url}/_stats")).json()["requests"])


async def measure(
    proxies: list[Proxy],
    judge_url: str,
    model: str,
    args: argparse.Namespace,
    profile: Callable[[], None] | None = None,
) -> tuple[dict[str, dict[str, Tally]], dict[str, float]]:
    asked = questions(max(args.requests, 16))
    per_round = max(1, args.requests // args.rounds)
    configs = select(args.configs)
    tallies = {p.name: {c.name: Tally() for c in configs} for p in proxies}
    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits, trust_env=False) as http:
        warm = [request_body(model, q, i, True, args.max_tokens) for q, i in asked[:4]]
        for proxy in proxies:  # caches, connections, lazily loaded modules
            for config in configs:
                await batch(http, proxy, config, warm[:2], 2)
        idle = await idle_cpu(proxies, args.idle_s) if args.idle_s > 0 else {}
        if profile is not None:  # after the warm-up: imports and first-use caches are not the per-token path
            profile()
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds} ...", file=sys.stderr, flush=True)
            start = r * per_round
            chosen = [asked[(start + k) % len(asked)] for k in range(per_round)]
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            for config in order:
                bodies = [request_body(model, q, i, config.stream, args.max_tokens) for q, i in chosen]
                for proxy in proxies if r % 2 == 0 else list(reversed(proxies)):
                    calls_before = await judge_requests(http, judge_url)
                    got = await batch(http, proxy, config, bodies, args.concurrency)
                    got.judge_calls = await judge_requests(http, judge_url) - calls_before
                    total = tallies[proxy.name][config.name]
                    total.cpu_s += got.cpu_s
                    total.kernel_s += got.kernel_s
                    total.wall_s += got.wall_s
                    total.tokens += got.tokens
                    total.requests += got.requests
                    total.errors += got.errors
                    total.judge_calls += got.judge_calls
                    total.examples += got.examples[: 3 - len(total.examples)]
    return tallies, idle


def report(tallies: dict[str, dict[str, Tally]], idle: dict[str, float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for proxy, by_config in tallies.items():
        idle_rate = (idle or {}).get(proxy)
        rows: dict[str, Any] = {}
        for config in CONFIGS:
            if config.name not in by_config:
                continue  # not measured (--configs)
            t = by_config[config.name]
            row: dict[str, Any] = {
                "cpu_us_per_token": t.per_token_us(),
                "kernel_us_per_token": round(t.kernel_s / t.tokens * 1e6, 1) if t.tokens else None,
                "tokens": t.tokens,
                "requests": t.requests,
                "tokens_per_request": round(t.tokens / t.requests, 1) if t.requests else None,
                "cpu_ms_per_request": round(t.cpu_s / t.requests * 1e3, 3) if t.requests else None,
                "errors": t.errors,
            }
            if idle_rate is not None:
                row["idle_us_per_token"] = t.idle_share_us(idle_rate)
            if t.examples:
                row["error_examples"] = t.examples
            if config.uses_judge:
                base_tally = by_config.get(Config("correct", "none", config.stream).name)
                base = base_tally.per_token_us() if base_tally is not None else None
                mine = t.per_token_us()
                row["judge_calls"] = t.judge_calls
                if base is not None and mine is not None:
                    row["judge_client_us_per_token"] = round(mine - base, 1)
                    if t.judge_calls:
                        row["judge_client_ms_per_call"] = round((mine - base) * t.tokens / t.judge_calls / 1000, 3)
            goal = GOALS_US.get(config.name)
            if goal is not None and row["cpu_us_per_token"] is not None:
                row["goal_us"] = goal
                row["goal_met"] = row["cpu_us_per_token"] <= goal
            rows[config.name] = row
        out[proxy] = rows
    return out


def goals(proxy_rows: dict[str, Any]) -> dict[str, Any]:
    """The goals block of one proxy's rows: each goal with its figure and verdict."""
    block: dict[str, Any] = {
        "rule": "cpu_us_per_token <= goal_us_per_token; detect/judge <= correct/judge, per token and per request"
    }
    for name, goal in GOALS_US.items():
        figure = (proxy_rows.get(name) or {}).get("cpu_us_per_token")
        if figure is not None:
            block[name] = {"goal_us_per_token": goal, "cpu_us_per_token": figure, "met": figure <= goal}
    detect = (proxy_rows.get("detect/judge stream") or {}).get("cpu_us_per_token")
    correct = (proxy_rows.get("correct/judge stream") or {}).get("cpu_us_per_token")
    if detect is not None and correct is not None:
        block["detect_not_above_correct"] = {"detect": detect, "correct": correct, "met": detect <= correct}
    # The same questions, per request: correct's completion tokens include the steps it regenerated, which
    # detect never asks for, so per token correct divides by more tokens than it streams for the same answer.
    detect_ms = (proxy_rows.get("detect/judge stream") or {}).get("cpu_ms_per_request")
    correct_ms = (proxy_rows.get("correct/judge stream") or {}).get("cpu_ms_per_request")
    if detect_ms is not None and correct_ms is not None:
        block["detect_not_above_correct_per_request"] = {
            "detect_ms": detect_ms,
            "correct_ms": correct_ms,
            "met": detect_ms <= correct_ms,
        }
    return block


def comparison(result: dict[str, Any], max_load: float) -> dict[str, Any]:
    """After over before, per configuration, measured side by side; refused on a loaded machine."""
    load = [result["machine"]["loadavg_before"][0], result["machine"]["loadavg_after"][0]]
    quiet = max(load) <= max_load
    out: dict[str, Any] = {"max_load": max_load, "load_1min_start_end": load, "quiet": quiet}
    if not quiet:
        out["refused"] = f"the 1-minute load average passed {max_load}: figures of this run are not compared"
        return out
    after, before = result["proxies"]["faithproxy"], result["proxies"]["faithproxy-before"]
    out["after_over_before"] = {
        name: round(row["cpu_us_per_token"] / before[name]["cpu_us_per_token"], 3)
        for name, row in after.items()
        if row.get("cpu_us_per_token") and (before.get(name) or {}).get("cpu_us_per_token")
    }
    return out


def wait_until_quiet(max_load: float, wait_s: float) -> None:
    """Waits (up to `wait_s`) for the 1-minute load average to fall to `max_load`: a run started on a busy
    machine measures the machine, not the proxy."""
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(5)


def render(result: dict[str, Any]) -> str:
    proxies = list(result["proxies"])
    head = ["configuration", *(f"{p} µs/token" for p in proxies), "tokens/request", "judge share µs/token"]
    rows = [head]
    for config in CONFIGS:
        if config.name not in result["proxies"][proxies[0]]:
            continue
        first = result["proxies"][proxies[0]][config.name]
        share = first.get("judge_client_us_per_token")
        rows.append(
            [
                config.name,
                *(_cell(result["proxies"][p][config.name]) for p in proxies),
                str(first["tokens_per_request"]),
                "–" if share is None else f"{share} ({first.get('judge_client_ms_per_call')} ms/call)",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    for proxy, rate in result.get("idle_cpu_ms_per_s", {}).items():
        lines.append(f"{proxy} idle: {rate} ms of CPU per second (in brackets: its share of each figure)")
    for proxy in proxies:
        for name, row in result["proxies"][proxy].items():
            if row["errors"]:
                lines.append(f"{proxy} {name}: {row['errors']} errors, e.g. {row.get('error_examples')}")
            if "goal_met" in row:
                lines.append(f"goal {proxy} {name} <= {row['goal_us']} µs/token: {row['goal_met']}")
    return "\n".join(lines)


def _cell(row: dict[str, Any]) -> str:
    idle = row.get("idle_us_per_token")
    return str(row["cpu_us_per_token"]) + ("" if idle is None else f" (idle {idle})")


def _judges(judge_url: str, backend: str) -> str:
    # An OpenAI-compatible base URL names the API's root (/v1, as vLLM's); Anthropic's SDK adds /v1 itself.
    base_url = f"{judge_url}/v1" if backend == "openai" else judge_url
    return json.dumps([{"name": "bench", "backend": backend, "model": "bench", "base_url": base_url, "api_key": "x"}])


def start_pixel_judge(workdir: Path) -> tuple[processes.Child, str]:
    """The judge stand-in, reading ShapesWorld images' pixels, in its own process; its URL."""
    port = processes.free_port()
    argv = [sys.executable, "-m", "faithproxy.benchmarks.standins.judge_server", "--port", str(port), "--shapesworld"]
    return processes.spawn(argv, workdir / "judge.log", name="judge"), f"http://127.0.0.1:{port}"


def start_proxy(name: str, upstream: str, judge_url: str, workdir: Path, site: Path | None, backend: str) -> Proxy:
    port = processes.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAITHPROXY_")}
    env |= {"FAITHPROXY_JUDGES": _judges(judge_url, backend), "FAITHPROXY_MAX_CONCURRENT_REQUESTS": "512"}
    cwd = None
    if site is not None:  # another installed copy first on the path, the repo's folders not on it
        env["PYTHONPATH"], cwd = str(site), workdir
    argv = [sys.executable, "-m", "faithproxy.cli", "serve", "--upstream", upstream, "--port", str(port)]
    child = processes.spawn([*argv, "--log-level", "warning"], workdir / f"{name}.log", name=name, env=env, cwd=cwd)
    return Proxy(name, f"http://127.0.0.1:{port}", child)


def generator_url(args: argparse.Namespace, workdir: Path, started: list[processes.Child]) -> str:
    """`--vllm-url`, or a vLLM started on `--model-dir` (the ShapesWorld model by default), added to
    `started` so that it is stopped with the rest."""
    if args.vllm_url is not None:
        return str(args.vllm_url)
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    model_dir = args.model_dir
    if model_dir is None:
        from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR

        model_dir = WEIGHTS_DIR
    print(f"starting vLLM ({model_dir}) ...", file=sys.stderr, flush=True)
    # --stream-interval N: vLLM sends the text of N tokens per frame (1, its default: a frame per token)
    extra = ["--stream-interval", str(args.stream_interval)] if args.stream_interval != 1 else []
    vllm = start_vllm(model_dir, extra_args=extra, log_path=workdir / "vllm.log")
    started.append(vllm.child)
    return str(vllm.base_url)


def start_profilers(proxies: list[Proxy], folder: Path) -> list[subprocess.Popen[bytes]]:
    """py-spy attached to each proxy: a flame graph and collapsed stacks, written when stopped."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for proxy in proxies:
        pid = str(proxy.child.process.pid)
        for fmt, suffix in (("flamegraph", "svg"), ("raw", "txt")):
            target = folder / f"{proxy.name}.{suffix}"
            argv = [spy, "record", "--pid", pid, "--rate", "250", "--nonblocking", "--format", fmt, "-o", str(target)]
            out.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # attached before the first request
    return out


def stop_profilers(profilers: list[subprocess.Popen[bytes]]) -> None:
    for spy in profilers:  # py-spy writes its output on SIGINT
        spy.send_signal(signal.SIGINT)
    for spy in profilers:
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()


@processes.supervised()  # a signal or a failure stops every server started inside
def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="faithproxy-cpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started: list[processes.Child] = []
    wait_until_quiet(args.max_load, args.wait_quiet_s)
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        url = generator_url(args, workdir, started)
        model = httpx.get(f"{url}/v1/models", trust_env=False).json()["data"][0]["id"]
        judge, judge_url = start_pixel_judge(workdir)
        started.append(judge)
        after_site = Path(args.after_site).resolve() if args.after_site else None
        proxies = [start_proxy("faithproxy", url, judge_url, workdir, after_site, args.judge_backend)]
        if args.baseline:
            site = Path(args.baseline).resolve()
            proxies.append(start_proxy("faithproxy-before", url, judge_url, workdir, site, args.judge_backend))
        started += [p.child for p in proxies]
        judge.wait_healthy(f"{judge_url}/_stats", 60)
        for proxy in proxies:
            proxy.child.wait_healthy(f"{proxy.url}/readyz", 60)
        started_at = time.perf_counter()
        profilers: list[subprocess.Popen[bytes]] = []
        profile = (lambda: profilers.extend(start_profilers(proxies, Path(args.profile)))) if args.profile else None
        try:
            tallies, idle = asyncio.run(measure(proxies, judge_url, model, args, profile))
        finally:
            stop_profilers(profilers)
        wall = time.perf_counter() - started_at
    finally:
        processes.stop_all(started)
    load_end_of_run = [round(x, 2) for x in os.getloadavg()]
    # The run loads both cores itself (vLLM at --concurrency), so the load right after it says nothing of
    # other work; read once its own processes have stopped and the 1-minute average has had time to fall.
    time.sleep(args.settle_s)
    rows = report(tallies, idle)
    result = {
        "command": "python -m faithproxy.benchmarks.performance.cpu_per_token " + " ".join(args.argv),
        "commit": git_commit(),
        "date": now(),
        "proxies": rows,
        "idle_cpu_ms_per_s": {name: round(rate * 1000, 3) for name, rate in idle.items()},
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "workdir", "argv")} | {"model": model},
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_end_of_run": load_end_of_run,
            "settle_s": args.settle_s,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "wall_s": round(wall, 1),
        },
        "goals": goals(rows["faithproxy"]),
    }
    if args.baseline:
        result["comparison"] = comparison(result, args.max_load)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.performance.cpu_per_token", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=64, help="requests per configuration (and proxy)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="the requests are split over this many rounds")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument(
        "--idle-s", type=float, default=10.0, help="seconds of each proxy's idle CPU to measure (0: none)"
    )
    parser.add_argument("--model-dir", help="default: the ShapesWorld model (benchmarks/shapesworld/model/weights)")
    parser.add_argument("--vllm-url", help="an already running vLLM (then --model-dir is not used)")
    parser.add_argument(
        "--stream-interval", type=int, default=1, help="vLLM's --stream-interval: tokens per streamed frame"
    )
    parser.add_argument(
        "--configs", help="only these, comma-separated: mode/detector[/stream|/non-stream], e.g. off/none/stream"
    )
    parser.add_argument("--baseline", metavar="SITE", help="also measure the faithproxy installed in SITE")
    parser.add_argument(
        "--after-site",
        metavar="SITE",
        help="run the measured faithproxy from SITE too, installed as the baseline is: the checkout and an"
        " installed copy of the same code differ by up to 9%% in off mode (an A/A pair)",
    )
    parser.add_argument("--profile", metavar="DIR", help="py-spy flame graphs of each proxy into DIR")
    parser.add_argument("--workdir", help="logs (default: a temporary folder)")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument(
        "--judge-backend",
        default="openai",
        choices=("openai", "anthropic"),
        help="the protocol the proxies speak to the stand-in judge: an OpenAI-compatible (vLLM) judge, or Claude's",
    )
    parser.add_argument("--max-load", type=float, default=MAX_LOAD, help="compare before/after only under this load")
    parser.add_argument(
        "--settle-s", type=float, default=60.0, help="seconds after the run before the closing load is read"
    )
    parser.add_argument("--wait-quiet-s", type=float, default=300.0, help="wait this long for the load to fall first")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    result = run(args)
    print(render(result))
    unjudged = [
        f"{proxy} {name}"
        for proxy, rows in result["proxies"].items()
        for name, row in rows.items()
        if "judge_calls" in row and not row["judge_calls"]
    ]
    if unjudged:  # every call failed (a wrong URL, a dead judge): the judge rows measured nothing
        print(f"no judge call reached the judge in: {', '.join(unjudged)}; nothing written", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
