"""The latency faithproxy adds under load, in off mode: the upstream reached directly vs faithproxy with
`--workers 1` vs `--workers 2`, all in front of the same fast local upstream, in one run (issue 49).

    .venv/bin/python -m faithproxy.benchmarks.performance.latency_under_load [--concurrency 1,16,64 \\
        --requests 2000 --rates 50,100,200,400,800 --step-s 10 --windows 5 --json out.json]

Every request is streamed (`--chunks` content chunks, checked against what the upstream sent) and
carries `x-faithproxy-mode: off`. Two phases, each interleaved over the targets in `--windows` windows,
the order rotating from one window to the next (as overhead.py does), so drift on a shared machine
hits every target alike:

1. closed loop: at each `--concurrency`, `--requests` requests per target with that many in flight;
   p50 and p99 of the time to the first content token (TTFT) and of the whole stream.
2. open loop: at each `--rates` rate, requests are started on a schedule (Poisson arrivals, or evenly
   spaced with `--arrivals even`) for `--step-s` seconds per target, none waiting on another; p50 and
   p99 of the whole stream. The client shares the machine: what it really sent (`sent_per_s`), how
   late it started requests behind the schedule (`start_lag_p99_ms`; a request not started by the end
   of its window is not sent) and the errors are recorded beside each figure. Where it fell short,
   direct and a proxy may have carried different rates: read their difference beside `sent_per_s`.

Added latency is a proxy's percentile minus direct's in the same phase. The goal: the first rate at
which the open loop's added p99 passes `GOAL_ADDED_P99_MS` (or the proxy fails requests direct did
not), per worker count; null when no rate tried passed it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.shapesworld_bench import git_commit
from faithproxy.benchmarks.performance import overhead_targets as targets
from faithproxy.benchmarks.performance.overhead import _raise_fd_limit, _rotated, _run_fixed, pct, summarize, warm_up
from faithproxy.benchmarks.performance.overhead_client import Result, make_client, request_body, stream_once
from faithproxy.benchmarks.performance.overhead_targets import Target
from faithproxy.benchmarks.tinyvlm.processes import supervised

PROG = "python -m faithproxy.benchmarks.performance.latency_under_load"
GOAL_ADDED_P99_MS = 5.0
WORKERS = {"1 worker": 1, "2 workers": 2}
HEADERS = {"x-faithproxy-mode": "off"}
# Reference points the issue quotes; published elsewhere, not measured here.
ANCHORS = {
    "note": "published figures quoted by issue 49 as reference points, not measured by this benchmark",
    "tensorzero": {"added_p99_ms": 0.94, "rate_per_s": 10000, "vcpus": 4, "what": "TensorZero's gateway overhead"},
    "python_gateways": {"added_ms_low": 2.0, "added_ms_high": 10.0, "what": "typical Python LLM gateways"},
}
ADDED_KEYS = ("ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms")


def add_differences(by_target: dict[str, dict[str, Any]]) -> None:
    """Each proxy's `added`: its percentile minus direct's, where both exist."""
    direct = by_target["direct"]
    for name, figures in by_target.items():
        if name == "direct":
            continue
        figures["added"] = {
            key: round(figures[key] - direct[key], 3)
            for key in ADDED_KEYS
            if figures.get(key) is not None and direct.get(key) is not None
        }


# ---- closed loop --------------------------------------------------------------------------------


async def closed_loop(
    all_targets: list[Target], clients: dict[str, Any], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    body = request_body(stream=True, chunks=args.chunks)
    per_window = max(1, args.requests // args.windows)
    out: dict[str, dict[str, Any]] = {}
    for concurrency in args.concurrency:
        print(f"closed loop: c={concurrency} ...", file=sys.stderr, flush=True)
        results: dict[str, list[Result]] = {t.name: [] for t in all_targets}
        busy_s = dict.fromkeys(results, 0.0)
        for w in range(args.windows):
            for target in _rotated(all_targets, w):
                started = time.perf_counter()
                results[target.name] += await _run_fixed(
                    clients[target.name], body, args.chunks, per_window, concurrency
                )
                busy_s[target.name] += time.perf_counter() - started
        figures = {
            name: summarize(rs, ttft=True) | {"rps": round(sum(r.ok for r in rs) / busy_s[name], 1)}
            for name, rs in results.items()
        }
        add_differences(figures)
        out[str(concurrency)] = figures
    return out


# ---- open loop ----------------------------------------------------------------------------------


def schedule(rate: float, seconds: float, arrivals: str, rng: random.Random) -> list[float]:
    """Start times (seconds from the window's start) of the requests at `rate` per second."""
    if arrivals == "even":  # k / rate, not a running sum: no rounding drift adds or drops one
        return [k / rate for k in range(1, int(seconds * rate) + 1) if k / rate < seconds]
    times, at = [], rng.expovariate(rate)
    while at < seconds:
        times.append(at)
        at += rng.expovariate(rate)
    return times


async def open_window(
    client: Any, body: bytes, chunks: int, starts: list[float], seconds: float
) -> tuple[list[Result], list[float]]:
    """Starts a request at each of `starts` (late ones at once, none after `seconds`) without waiting
    for any; returns every result and how late each request started behind its time."""
    lags: list[float] = []
    origin = time.perf_counter()

    async def one(due: float) -> Result:
        lags.append(time.perf_counter() - due)
        return await stream_once(client, body, chunks)

    tasks = []
    for at in starts:
        delay = origin + at - time.perf_counter()
        await asyncio.sleep(max(delay, 0.0))  # 0: let started requests run while catching up
        if time.perf_counter() - origin >= seconds:
            break
        tasks.append(asyncio.create_task(one(origin + at)))
    return list(await asyncio.gather(*tasks)), lags


async def open_loop(
    all_targets: list[Target], clients: dict[str, Any], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    body = request_body(stream=True, chunks=args.chunks)
    window_s = args.step_s / args.windows
    out: dict[str, dict[str, Any]] = {}
    for i, rate in enumerate(args.rates):
        print(f"open loop: {rate:g}/s ...", file=sys.stderr, flush=True)
        results: dict[str, list[Result]] = {t.name: [] for t in all_targets}
        lags: dict[str, list[float]] = {t.name: [] for t in all_targets}
        scheduled = 0
        for w in range(args.windows):
            # every target gets the same arrival times in a window
            starts = schedule(rate, window_s, args.arrivals, random.Random(args.seed * 1_000_003 + i * 1009 + w))
            scheduled += len(starts)
            for target in _rotated(all_targets, i + w):
                done, late = await open_window(clients[target.name], body, args.chunks, starts, window_s)
                results[target.name] += done
                lags[target.name] += late
        figures: dict[str, dict[str, Any]] = {}
        for name, rs in results.items():
            lag = pct(lags[name], 99)
            figures[name] = summarize(rs, ttft=True) | {
                "asked_per_s": rate,
                "scheduled": scheduled,
                "sent": len(rs),
                "sent_per_s": round(len(rs) / args.step_s, 1),
                "start_lag_p99_ms": None if lag is None else round(lag * 1000, 3),
            }
        add_differences(figures)
        out[f"{rate:g}"] = figures
    return out


# ---- goals, the run -----------------------------------------------------------------------------


def first_rate_over(open_figures: dict[str, dict[str, Any]], proxy: str, goal_ms: float) -> dict[str, Any]:
    """The first rate (in the order tried) at which `proxy`'s added total p99 passes `goal_ms` or it
    failed requests direct did not; None if none did. `met`: no rate did, None if a rate had no figure."""
    first = None
    measurable = True
    for rate, figures in open_figures.items():
        mine, direct = figures[proxy], figures["direct"]
        added = mine["added"].get("total_p99_ms")
        measurable = measurable and added is not None
        if (added is not None and added > goal_ms) or mine["errors"] > direct["errors"]:
            first = float(rate)
            break
    tried = [float(rate) for rate in open_figures]
    return {
        "value": first,
        "goal": goal_ms,
        "highest_rate_tried": max(tried) if tried else None,
        "met": None if first is None and not measurable else first is None,
    }


def goals(open_figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "rule": f"value: the first asked rate (req/s) at which the open loop's added total p99 (proxy minus "
        f"direct) passes {GOAL_ADDED_P99_MS} ms or the proxy fails requests direct did not; null and met: "
        "no rate tried did (up to highest_rate_tried)",
        "added_p99_under_5ms_at_rate": {
            name: first_rate_over(open_figures, name, GOAL_ADDED_P99_MS) for name in WORKERS
        },
    }


def _loop_runner() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


async def measure(all_targets: list[Target], args: argparse.Namespace) -> dict[str, Any]:
    connections = max([*args.concurrency, args.max_connections]) + 16
    clients = {t.name: make_client(t.base_url, connections) for t in all_targets}
    for client in clients.values():
        client.headers.update(HEADERS)
    try:
        await warm_up(clients, args.chunks, 32)  # connections, and lazily loaded modules in each worker
        report = {"closed_loop": await closed_loop(all_targets, clients, args)} if args.concurrency else {}
        if args.rates:
            report["open_loop"] = await open_loop(all_targets, clients, args)
        return report
    finally:
        for client in clients.values():
            await client.aclose()


def _machine() -> dict[str, Any]:
    uname = platform.uname()
    return {"uname": f"{uname.system} {uname.release} {uname.version} {uname.machine}", "cpus": os.cpu_count()}


@supervised()  # a signal or a failure stops every server started inside
def run(args: argparse.Namespace) -> dict[str, Any]:
    _raise_fd_limit(4 * args.max_connections + 1024)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="faithproxy-under-load-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_start = [round(x, 2) for x in os.getloadavg()]
    started: list[Target] = []
    wall = time.perf_counter()
    try:
        upstream = targets.start_ready(lambda: targets.start_upstream(workdir, args.chunks), "/v1/models", 30)
        started.append(upstream)
        for name, n in WORKERS.items():
            started.append(
                targets.start_ready(
                    lambda name=name, n=n: targets.start_faithproxy(
                        workdir, upstream.base_url, 4096, name=name, workers=n
                    ),
                    "/healthz",
                    60,
                )
            )
        report = _loop_runner()(measure(started, args))
    finally:
        for target in reversed(started):
            targets.stop(target)
    return {
        "command": shlex.join([*PROG.split(), *args.argv]),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": _machine()
        | {
            "loadavg_start": load_start,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "wall_s": round(time.perf_counter() - wall, 1),
        },
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "workdir", "argv")},
        **report,
        "goals": goals(report.get("open_loop", {})),
        "anchors": ANCHORS,
    }


# ---- output -------------------------------------------------------------------------------------


def _f(value: Any, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.2f}" if signed else f"{value:.2f}" if isinstance(value, float) else str(value)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def _pair(figures: dict[str, Any], key: str, signed: bool = False) -> str:
    p50, p99 = figures.get(f"{key}_p50_ms"), figures.get(f"{key}_p99_ms")
    return f"{_f(p50, signed)} / {_f(p99, signed)}"


def render(result: dict[str, Any]) -> str:
    lines: list[str] = []
    if closed := result.get("closed_loop"):
        lines.append("closed loop (ms); added = proxy - direct")
        rows = [("c", "target", "TTFT p50/p99", "total p50/p99", "added TTFT", "added total", "req/s", "errors")]
        for conc, by_target in closed.items():
            for name, f in by_target.items():
                added = f.get("added")
                rows.append(
                    (conc, name, _pair(f, "ttft"), _pair(f, "total"))
                    + ((_pair(added, "ttft", True), _pair(added, "total", True)) if added is not None else ("", ""))
                    + (_f(f["rps"]), str(f["errors"]))
                )
        lines += _table(rows)
    if opened := result.get("open_loop"):
        lines += ["", "open loop (ms); added = proxy - direct"]
        rows = [("asked/s", "target", "sent/s", "start lag p99", "total p50/p99", "added p99", "errors")]
        for rate, by_target in opened.items():
            for name, f in by_target.items():
                added = _f(f["added"].get("total_p99_ms"), True) if "added" in f else ""
                rows.append(
                    (rate, name, _f(f["sent_per_s"]), _f(f["start_lag_p99_ms"]), _pair(f, "total"), added)
                    + (str(f["errors"]),)
                )
        lines += _table(rows)
    lines.append("")
    for name, goal in result["goals"]["added_p99_under_5ms_at_rate"].items():
        at = "no rate tried" if goal["value"] is None else f"{goal['value']:g}/s"
        lines.append(
            f"{name}: added p99 first passes {goal['goal']:g} ms at {at} "
            f"(highest tried {goal['highest_rate_tried']:g}/s); met: {goal['met']}"
        )
    return "\n".join(lines)


def _numbers(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(x) for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=_numbers(int), default=[1, 16, 64], help="closed loop: in flight")
    parser.add_argument("--requests", type=int, default=2000, help="closed loop: requests per target and concurrency")
    parser.add_argument("--rates", type=_numbers(float), default=[50, 100, 200, 400, 800], help="open loop: req/s")
    parser.add_argument("--step-s", type=float, default=10.0, help="open loop: seconds per rate and target")
    parser.add_argument("--arrivals", choices=("poisson", "even"), default="poisson")
    parser.add_argument("--seed", type=int, default=0, help="of the Poisson arrival times")
    parser.add_argument("--windows", type=int, default=5, help="windows per phase step, the target order rotating")
    parser.add_argument("--chunks", type=int, default=32, help="content chunks per answer")
    parser.add_argument("--max-connections", type=int, default=512, help="the client's pool per target")
    parser.add_argument("--workdir", help="the servers' logs (default: a temporary folder)")
    parser.add_argument("--json", help="write every figure here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    result = run(args)
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"loadavg start/end: {result['machine']['loadavg_start']} / {result['machine']['loadavg_end']}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
