"""Proxy overhead and load: the upstream reached directly vs faithproxy (off mode, no detector) vs
LiteLLM's proxy, all in front of the same fast local upstream, measured in one run.

    python -m faithproxy.benchmarks.performance.overhead [--requests 300 --concurrency 32 --streams 1000 \\
        --json out.json]

Phases, each interleaved over the targets (round-robin, the order rotating every round, so drift on
a shared machine hits every target alike):

1. latency: `--requests` rounds at concurrency 1; each round sends one streamed and one non-streamed
   request to every target. Added latency is a proxy's percentile minus direct's.
2. throughput: `--windows` windows per target of `--rps-requests` streamed requests at
   `--concurrency`; requests per second and the proxy's CPU time per request.
3. memory: `--hold` streams held open through each proxy (the upstream holds them after their first
   chunk until released); (RSS open - RSS idle) / streams open.
4. load: `--streams` streams started at once through faithproxy (and direct, as the client's own
   baseline); the upstream holds each after its first chunk until all are open, so they really are
   open at the same time; then `--stream-chunks` chunks `--stream-delay-ms` apart: errors, how many
   were open at once, TTFT, completion.

Without `.venv-litellm` the script says so and races direct vs faithproxy only. `--baseline SITE` adds
a second faithproxy, another version of the code installed in SITE, as `faithproxy-before`: a change's
before and after measured side by side in one interleaved run. A figure is printed
as a table; `--json PATH` also writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.performance import overhead_targets as targets
from faithproxy.benchmarks.performance.overhead_client import (
    Result,
    complete_once,
    cpu_seconds,
    make_client,
    request_body,
    rss_bytes,
    stream_once,
)
from faithproxy.benchmarks.performance.overhead_targets import Target
from faithproxy.benchmarks.tinyvlm.processes import supervised
from faithproxy.testing import metric

GOAL_ADDED_P50_MS = 1.0
GOAL_LITELLM_FRACTION = 1 / 3
GOAL_RPS_FRACTION = 0.8  # of direct's streamed req/s at the throughput phase's concurrency
GOAL_RSS_MIB = 100.0  # peak RSS of the proxy in the throughput phase
HOLD_WAIT_S = 60.0  # longest wait for all held streams to open


def pct(values: Sequence[float], q: float) -> float | None:
    """Percentile q (0–100) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def summarize(results: Sequence[Result], *, ttft: bool = False) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out: dict[str, Any] = {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "total_p50_ms": _ms(pct([r.total_s for r in ok], 50)),
        "total_p99_ms": _ms(pct([r.total_s for r in ok], 99)),
    }
    if ttft:
        firsts = [r.ttft_s for r in ok if r.ttft_s is not None]
        out["ttft_p50_ms"] = _ms(pct(firsts, 50))
        out["ttft_p99_ms"] = _ms(pct(firsts, 99))
    errors = sorted({r.error for r in results if r.error})
    if errors:
        out["error_examples"] = errors[:5]
    return out


def _rotated(items: Sequence[Target], i: int) -> list[Target]:
    i %= len(items)
    return list(items[i:]) + list(items[:i])


# ---- phases -------------------------------------------------------------------------------------


async def warm_up(clients: dict[str, Any], chunks: int, n: int) -> None:
    stream, plain = request_body(stream=True, chunks=chunks), request_body(stream=False, chunks=chunks)
    for client in clients.values():
        await asyncio.gather(*(stream_once(client, stream, chunks) for _ in range(n)))
        for _ in range(n):
            await complete_once(client, plain, chunks)


async def latency_phase(all_targets: list[Target], clients: dict[str, Any], rounds: int, chunks: int) -> dict:
    stream, plain = request_body(stream=True, chunks=chunks), request_body(stream=False, chunks=chunks)
    streamed: dict[str, list[Result]] = {t.name: [] for t in all_targets}
    plain_results: dict[str, list[Result]] = {t.name: [] for t in all_targets}
    for i in range(rounds):
        for target in _rotated(all_targets, i):
            streamed[target.name].append(await stream_once(clients[target.name], stream, chunks))
        for target in _rotated(all_targets, i + 1):
            plain_results[target.name].append(await complete_once(clients[target.name], plain, chunks))
    out = {}
    for name in streamed:
        out[name] = {"stream": summarize(streamed[name], ttft=True), "non_stream": summarize(plain_results[name])}
    direct = out["direct"]
    for name, figures in out.items():
        if name == "direct":
            continue
        added = {}
        for kind, key in (("stream", "ttft"), ("stream", "total"), ("non_stream", "total")):
            for q in ("p50", "p99"):
                mine, base = figures[kind].get(f"{key}_{q}_ms"), direct[kind].get(f"{key}_{q}_ms")
                if mine is not None and base is not None:
                    added[f"{kind}_{key}_{q}_ms"] = round(mine - base, 3)
        figures["added"] = added
    return out


async def _run_fixed(client: Any, body: bytes, chunks: int, n: int, concurrency: int) -> list[Result]:
    """`n` streamed requests, `concurrency` in flight at any time."""
    results: list[Result] = []
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            results.append(await stream_once(client, body, chunks))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
    return results


async def throughput_phase(
    all_targets: list[Target], clients: dict[str, Any], *, windows: int, n: int, concurrency: int, chunks: int
) -> dict:
    body = request_body(stream=True, chunks=chunks)
    rates: dict[str, list[float]] = {t.name: [] for t in all_targets}
    cpu: dict[str, list[float]] = {t.name: [] for t in all_targets}
    results: dict[str, list[Result]] = {t.name: [] for t in all_targets}
    peak_rss: dict[str, int] = {}
    for w in range(windows):
        for target in _rotated(all_targets, w):
            pid = target.proc.pid if target.proc is not None else None
            cpu_before = cpu_seconds(pid) if pid and target.name != "direct" else None
            started = time.perf_counter()
            watch = _PeakRSS(pid) if pid and target.name != "direct" else None
            window = await _run_fixed(clients[target.name], body, chunks, n, concurrency)
            elapsed = time.perf_counter() - started
            if watch is not None:
                peak_rss[target.name] = max(peak_rss.get(target.name, 0), await watch.stop())
            if cpu_before is not None and pid:
                cpu[target.name].append((cpu_seconds(pid) - cpu_before) / n)
            rates[target.name].append(sum(r.ok for r in window) / elapsed)
            results[target.name] += window
    out = {}
    for name in rates:
        out[name] = {
            "concurrency": concurrency,
            "requests": len(results[name]),
            "errors": sum(not r.ok for r in results[name]),
            "rps_median": round(statistics.median(rates[name]), 1),
            "rps_windows": [round(r, 1) for r in rates[name]],
            "latency_p50_ms": _ms(pct([r.total_s for r in results[name] if r.ok], 50)),
            "latency_p99_ms": _ms(pct([r.total_s for r in results[name] if r.ok], 99)),
        }
        errors = sorted({r.error for r in results[name] if r.error})
        if errors:
            out[name]["error_examples"] = errors[:5]
        if cpu[name]:
            out[name]["proxy_cpu_ms_per_request"] = round(statistics.median(cpu[name]) * 1000, 3)
        if name in peak_rss:
            out[name]["peak_rss_mib"] = round(peak_rss[name] / 2**20, 1)
    direct = out.get("direct", {}).get("rps_median")
    for name, figures in out.items():
        if name != "direct" and direct:
            figures["rps_fraction_of_direct"] = round(figures["rps_median"] / direct, 3)
    return out


class _PeakRSS:
    """Samples a process's RSS every 50 ms from creation until `stop()`, which returns the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            self.peak = max(self.peak, rss_bytes(self.pid))

    async def stop(self) -> int:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return max(self.peak, rss_bytes(self.pid))


class _OpenStreams:
    """Counts streams that got their first token and those that ended; `settled` is set once every
    stream is either open or ended without ever opening."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.opened = self.finished = self.never_opened = 0
        self.settled = asyncio.Event()

    def first(self) -> None:
        self.opened += 1
        self._check()

    def end(self, result: Result) -> None:
        self.finished += 1
        self.never_opened += result.ttft_s is None
        self._check()

    def _check(self) -> None:
        if self.opened + self.never_opened >= self.n:
            self.settled.set()


async def _held_rss(pid: int, client: Any, upstream: Any, hold: int) -> dict[str, Any]:
    """RSS of `pid` idle, then with `hold` streams open (the upstream holds each after its first
    content chunk until released), per stream."""
    chunks = 4
    body = request_body(stream=True, chunks=chunks, hold=True)
    await asyncio.sleep(0.5)
    idle = statistics.median(rss_bytes(pid) for _ in range(3))
    streams = _OpenStreams(hold)
    await upstream.post("/bench/arm")

    async def one() -> Result:
        result = await stream_once(client, body, chunks, streams.first)
        streams.end(result)
        return result

    tasks = [asyncio.create_task(one()) for _ in range(hold)]
    try:
        await asyncio.wait_for(streams.settled.wait(), timeout=HOLD_WAIT_S)
    except TimeoutError:
        pass  # divided by the streams open when sampled
    await asyncio.sleep(0.2)  # let the proxy settle on what it holds per stream
    open_now = streams.opened - streams.finished
    held = statistics.median(rss_bytes(pid) for _ in range(3))
    await upstream.post("/bench/release")
    results = await asyncio.gather(*tasks)
    return {
        "streams_open": open_now,
        "idle_rss_mib": round(idle / 2**20, 1),
        "open_rss_mib": round(held / 2**20, 1),
        "kib_per_stream": round((held - idle) / max(open_now, 1) / 1024, 1),
        "errors": sum(not r.ok for r in results),
    }


async def memory_phase(proxies: list[Target], clients: dict[str, Any], *, hold: int) -> dict:
    out = {}
    for target in proxies:
        assert target.proc is not None
        out[target.name] = await _held_rss(target.proc.pid, clients[target.name], clients["direct"], hold)
    return out


async def _load_one(
    pid: int | None, client: Any, upstream: Any, *, streams: int, chunks: int, delay_ms: float, open_timeout_s: float
) -> dict[str, Any]:
    """`streams` streams started at once; the upstream holds each after its first content chunk until
    all are open (or `open_timeout_s` passed), so they are open at the same time; then the rest
    follows, `delay_ms` apart."""
    body = request_body(stream=True, chunks=chunks, delay_ms=delay_ms, hold=True)
    counter = _OpenStreams(streams)
    await upstream.post("/bench/arm")
    peak_rss = 0
    done = asyncio.Event()

    async def one() -> Result:
        result = await stream_once(client, body, chunks, counter.first)
        counter.end(result)
        return result

    async def watch_rss() -> None:
        nonlocal peak_rss
        while pid and not done.is_set():
            peak_rss = max(peak_rss, rss_bytes(pid))
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch_rss())
    started = time.perf_counter()
    tasks = [asyncio.create_task(one()) for _ in range(streams)]
    try:
        await asyncio.wait_for(counter.settled.wait(), timeout=open_timeout_s)
    except TimeoutError:
        pass
    opening_s = time.perf_counter() - started
    open_at_once = counter.opened - counter.finished
    await upstream.post("/bench/release")
    results = await asyncio.gather(*tasks)
    done.set()
    await watcher
    figures = summarize(results, ttft=True)
    figures |= {
        "completed": sum(r.ok for r in results),
        "open_at_once": open_at_once,
        "opening_s": round(opening_s, 2),
        "all_opened": counter.opened == streams and open_at_once == streams,
        "wall_s": round(time.perf_counter() - started, 2),
        "stream_after_release_ms": round(delay_ms * (chunks - 1), 1),
    }
    if pid:
        figures["peak_rss_mib"] = round(peak_rss / 2**20, 1)
    return figures


async def load_phase(load_targets: list[Target], clients: dict[str, Any], **kwargs: Any) -> dict:
    out = {}
    for target in load_targets:
        pid = target.proc.pid if target.proc is not None and target.name != "direct" else None
        out[target.name] = await _load_one(pid, clients[target.name], clients["direct"], **kwargs)
    return out


# ---- the run ------------------------------------------------------------------------------------


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard) if hard > 0 else needed, hard))


def _litellm_version() -> str | None:
    found = sorted(targets.ROOT.glob(".venv-litellm/lib/python*/site-packages/litellm-*.dist-info"))
    return found[-1].name.removeprefix("litellm-").removesuffix(".dist-info") if found else None


async def measure(args: argparse.Namespace, all_targets: list[Target]) -> dict[str, Any]:
    connections = max(args.concurrency, args.streams, args.hold) + 16
    clients = {t.name: make_client(t.base_url, connections) for t in all_targets}
    proxies = [t for t in all_targets if t.name != "direct"]
    try:
        await warm_up(clients, args.chunks, 20)
        report: dict[str, Any] = {}
        print(f"latency: {args.requests} rounds ...", file=sys.stderr, flush=True)
        report["latency"] = await latency_phase(all_targets, clients, args.requests, args.chunks)
        print(f"throughput: {args.windows} x {args.rps_requests} at c={args.concurrency} ...", file=sys.stderr)
        report["throughput"] = await throughput_phase(
            all_targets,
            clients,
            windows=args.windows,
            n=args.rps_requests,
            concurrency=args.concurrency,
            chunks=args.chunks,
        )
        if args.hold:
            print(f"memory: {args.hold} open streams ...", file=sys.stderr, flush=True)
            report["memory"] = await memory_phase(proxies, clients, hold=args.hold)
        if args.streams:
            load_targets = [t for t in all_targets if t.name in ("direct", "faithproxy")]
            if args.load_litellm:
                load_targets += [t for t in proxies if t.name == "litellm"]
            print(f"load: {args.streams} concurrent streams ...", file=sys.stderr, flush=True)
            report["load"] = await load_phase(
                load_targets,
                clients,
                streams=args.streams,
                chunks=args.stream_chunks,
                delay_ms=args.stream_delay_ms,
                open_timeout_s=args.open_timeout_s,
            )
        return report
    finally:
        for client in clients.values():
            await client.aclose()


def goals(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals, judged on streamed TTFT and non-streamed latency alike (None: not measurable,
    e.g. every request of a target failed)."""
    lat = report["latency"]
    fp = lat["faithproxy"]["added"]
    out: dict[str, Any] = {}
    for key in ("stream_ttft_p50_ms", "stream_total_p50_ms", "non_stream_total_p50_ms"):
        mine = fp.get(key)
        out[f"{key}_under_1ms"] = None if mine is None else mine < GOAL_ADDED_P50_MS
        if "litellm" in lat:
            theirs = lat["litellm"]["added"].get(key)
            measurable = mine is not None and theirs is not None and theirs > 0
            out[f"{key}_ratio_to_litellm"] = round(mine / theirs, 3) if measurable else None
            out[f"{key}_at_most_third_of_litellm"] = mine <= theirs * GOAL_LITELLM_FRACTION if measurable else None
    thr = report["throughput"]["faithproxy"]
    fraction = thr.get("rps_fraction_of_direct")
    out["rps_at_least_80pct_of_direct"] = None if fraction is None else fraction >= GOAL_RPS_FRACTION
    peak = thr.get("peak_rss_mib")
    out["peak_rss_at_most_100mib"] = None if peak is None else peak <= GOAL_RSS_MIB
    if "load" in report:
        load = report["load"]["faithproxy"]
        out["load_zero_errors"] = load["errors"] == 0
        out["load_all_open_at_once"] = load["all_opened"]
    return out


def _fmt(value: Any, signed: bool = False) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:+.2f}" if signed else f"{value:.2f}"
    return str(value)


def render(report: dict[str, Any]) -> str:
    names = list(report["latency"])
    rows: list[tuple[str, ...]] = [("", *names)]
    lat = report["latency"]

    def pair(name: str, kind: str, key: str) -> str:
        figs = lat[name][kind]
        return f"{_fmt(figs[f'{key}_p50_ms'])} / {_fmt(figs[f'{key}_p99_ms'])}"

    def added(name: str, kind: str, key: str) -> str:
        if name == "direct":
            return "–"
        figs = lat[name]["added"]
        return f"{_fmt(figs.get(f'{kind}_{key}_p50_ms'), True)} / {_fmt(figs.get(f'{kind}_{key}_p99_ms'), True)}"

    rows.append(("stream TTFT p50 / p99 (ms)", *(pair(n, "stream", "ttft") for n in names)))
    rows.append(("  added over direct (ms)", *(added(n, "stream", "ttft") for n in names)))
    rows.append(("stream complete p50 / p99 (ms)", *(pair(n, "stream", "total") for n in names)))
    rows.append(("  added over direct (ms)", *(added(n, "stream", "total") for n in names)))
    rows.append(("non-stream p50 / p99 (ms)", *(pair(n, "non_stream", "total") for n in names)))
    rows.append(("  added over direct (ms)", *(added(n, "non_stream", "total") for n in names)))
    rows.append(
        ("latency-phase errors", *(str(lat[n]["stream"]["errors"] + lat[n]["non_stream"]["errors"]) for n in names))
    )
    thr = report["throughput"]
    conc = next(iter(thr.values()))["concurrency"]
    rows.append((f"streamed req/s at c={conc} (median)", *(_fmt(thr[n]["rps_median"]) for n in names)))
    rows.append(("  fraction of direct's", *(_fmt(thr[n].get("rps_fraction_of_direct")) for n in names)))
    rows.append(("  proxy CPU per request (ms)", *(_fmt(thr[n].get("proxy_cpu_ms_per_request")) for n in names)))
    rows.append(("  proxy peak RSS (MiB)", *(_fmt(thr[n].get("peak_rss_mib")) for n in names)))
    rows.append(("  errors", *(str(thr[n]["errors"]) for n in names)))
    if "memory" in report:
        mem = report["memory"]
        rows.append(("idle RSS (MiB)", *(_fmt(mem[n]["idle_rss_mib"]) if n in mem else "–" for n in names)))
        rows.append(
            (
                "memory per open stream (KiB)",
                *(
                    f"{_fmt(mem[n]['kib_per_stream'])} ({mem[n]['streams_open']} open)" if n in mem else "–"
                    for n in names
                ),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    if "load" in report:
        lines.append("")
        for name, figs in report["load"].items():
            lines.append(
                f"{figs['requests']} concurrent streams via {name}: {figs['errors']} errors, "
                f"{figs['open_at_once']} open at once after {figs['opening_s']} s, {figs['completed']} completed; "
                f"TTFT p50/p99 {_fmt(figs['ttft_p50_ms'])} / {_fmt(figs['ttft_p99_ms'])} ms; "
                f"complete p50/p99 {_fmt(figs['total_p50_ms'])} / {_fmt(figs['total_p99_ms'])} ms; "
                f"wall {figs['wall_s']} s"
                + (f"; peak RSS {figs['peak_rss_mib']} MiB" if "peak_rss_mib" in figs else "")
            )
    lines.append("")
    for key, value in report["goals"].items():
        lines.append(f"goal {key}: {value}")
    return "\n".join(lines)


@supervised()  # a signal or a failure stops every server started inside
def run(args: argparse.Namespace) -> dict[str, Any]:
    _raise_fd_limit(4 * max(args.streams, args.hold, args.concurrency) + 1024)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="faithproxy-overhead-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    use_litellm = not args.no_litellm and targets.litellm_available()
    if not args.no_litellm and not use_litellm:
        print(f"LiteLLM not found at {targets.LITELLM_BIN}: measuring direct vs faithproxy only", file=sys.stderr)
    started: list[Target] = []
    try:
        upstream = targets.start_ready(lambda: targets.start_upstream(workdir, args.chunks), "/v1/models", 30)
        started.append(upstream)
        limit = max(4096, 2 * args.streams)
        started.append(
            targets.start_ready(lambda: targets.start_faithproxy(workdir, upstream.base_url, limit), "/healthz", 60)
        )
        if args.baseline:
            site = Path(args.baseline).resolve()
            started.append(
                targets.start_ready(
                    lambda: targets.start_faithproxy(
                        workdir, upstream.base_url, limit, name="faithproxy-before", site=site
                    ),
                    "/healthz",
                    60,
                )
            )
        if args.shadow_shares:  # off with shadow checks at each share, beside plain off (server/shadow/checker.py)
            judge = targets.start_ready(lambda: targets.start_judge(workdir), "/_stats", 60)
            started.append(judge)
            for share in args.shadow_shares:
                env = targets.shadow_env(share, judge.base_url)
                name = f"faithproxy-shadow-{share:g}"
                started.append(
                    targets.start_ready(
                        lambda env=env, name=name: targets.start_faithproxy(
                            workdir, upstream.base_url, limit, name=name, env_extra=env
                        ),
                        "/healthz",
                        60,
                    )
                )
        if use_litellm:
            print("waiting for LiteLLM to start ...", file=sys.stderr, flush=True)
            started.append(
                targets.start_ready(
                    lambda: targets.start_litellm(workdir, upstream.base_url), "/health/liveliness", 180
                )
            )
        loop_runner = asyncio.run
        try:
            import uvloop

            loop_runner = uvloop.run
        except ImportError:
            pass
        measured = [t for t in started if t.name != "judge"]
        report = loop_runner(measure(args, measured))
        if args.shadow_shares:
            report["shadow"] = shadow_figures(report["latency"], measured)
    finally:
        for target in reversed(started):
            targets.stop(target)
    report["goals"] = goals(report)
    report["config"] = {k: v for k, v in vars(args).items() if k not in ("json", "workdir")} | {
        "litellm": _litellm_version() if use_litellm else None
    }
    report["machine"] = {
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }
    return report


GOAL_SHADOW_ADDED_P50_MS = 0.5  # TTFT that shadow sampling may add to plain off mode (issue 44)
GOAL_SHADOW_ADDED_P99_MS = 1.0


def shadow_figures(latency: dict[str, Any], measured: list[Target]) -> dict[str, Any]:
    """Per shadow-checking target: streamed TTFT added over plain off (the same run, interleaved), its
    goals, and what its shadow checks did (faithproxy_shadow_requests_total by outcome, read from /metrics)."""
    plain = latency["faithproxy"]["stream"]
    out: dict[str, Any] = {}
    for target in measured:
        if not target.name.startswith("faithproxy-shadow-"):
            continue
        mine = latency[target.name]["stream"]
        added = {q: round(mine[f"ttft_{q}_ms"] - plain[f"ttft_{q}_ms"], 3) for q in ("p50", "p99")}
        text = httpx.get(target.base_url + "/metrics", timeout=10).text
        outcomes = ("not_sampled", "checked", "queue_full", "over_budget", "unreadable", "failed")
        out[target.name] = {
            "added_ttft_over_off_ms": added,
            "goals": {
                "added_ttft_p50_under_0.5ms": added["p50"] <= GOAL_SHADOW_ADDED_P50_MS,
                "added_ttft_p99_under_1ms": added["p99"] <= GOAL_SHADOW_ADDED_P99_MS,
            },
            "shadow_requests": {o: metric(text, "faithproxy_shadow_requests_total", outcome=o) for o in outcomes},
            "shadow_perception_steps": metric(text, "faithproxy_perception_steps_total", source="shadow"),
        }
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.performance.overhead", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=300, help="latency rounds (each: every target, both kinds)")
    parser.add_argument("--chunks", type=int, default=8, help="content chunks per answer in phases 1-2")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight in the throughput phase")
    parser.add_argument("--windows", type=int, default=3, help="throughput windows per target")
    parser.add_argument("--rps-requests", type=int, default=400, help="requests per throughput window")
    parser.add_argument("--hold", type=int, default=200, help="streams held open for the memory figure (0: skip)")
    parser.add_argument("--streams", type=int, default=1000, help="concurrent streams in the load phase (0: skip)")
    parser.add_argument("--stream-chunks", type=int, default=20)
    parser.add_argument("--stream-delay-ms", type=float, default=50.0)
    parser.add_argument("--open-timeout-s", type=float, default=20.0, help="longest wait for all load streams to open")
    parser.add_argument("--load-litellm", action="store_true", help="send the load phase through LiteLLM too")
    parser.add_argument("--no-litellm", action="store_true", help="race direct vs faithproxy only")
    parser.add_argument(
        "--baseline",
        metavar="SITE",
        help="also race the faithproxy installed in SITE as 'faithproxy-before' (pip install --no-deps --target "
        "SITE <checkout of the code before>): before and after in one interleaved run",
    )
    parser.add_argument(
        "--shadow-shares",
        type=lambda text: [float(x) for x in text.split(",") if x],
        default=[],
        help="also race faithproxy off with shadow checks at these shares (e.g. 0.1,1.0) against plain off",
    )
    parser.add_argument("--workdir", help="logs and the LiteLLM config (default: a temporary folder)")
    parser.add_argument("--json", help="write every figure here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = run(args)
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
