"""The dashboard shows the truth: a real Prometheus, known traffic, every expression evaluated.

Real vLLM serves the fixture model, whose chains carry planted unfaithful perception steps
(benchmarks/tinyvlm/fixture_spec.py); a local judge knows which; faithproxy runs in-process. Prometheus (Debian's
binary) runs the repo's config and rules, scraping both every second. After a known mix of requests
(corrected, failed regeneration, detect mode, self-check, no detector, judge down, off mode) every
PromQL expression of the dashboard and of the rules goes through Prometheus's HTTP API: each must
parse and return series, and every UPR and unchecked-share figure must equal what the traffic implies.

Why exact equality holds: all faithproxy series exist at 0 before the first scrape (server.metrics
pre-initialises them) and share the scrape timestamps, so rate() and increase() extrapolate numerator
and denominator by the same factor, and the factor cancels in the ratio as long as the window covers
the whole test. The dashboard's windows ($__range, $__rate_interval) are set to cover it; the rules'
fixed 5m windows cover it because the traffic takes well under five minutes.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.clients.vllm import CHAT_PATH
from faithproxy.detectors.registry import DETECTORS
from faithproxy.faithcore.kinds import classify_step
from faithproxy.faithcore.types import StepKind
from faithproxy.server.app import create_app
from faithproxy.testing import running_app
from tests.deploy import assets
from tests.deploy.assets import quantity
from tests.deploy.prometheus_server import PrometheusError, PrometheusServer, render_config, start_prometheus
from tests.support import local_judge_settings

pytestmark = [pytest.mark.integration]

RULE_WINDOW_S = 300  # the rules' [5m]
TRAFFIC_BUDGET_S = RULE_WINDOW_S - 30  # traffic + scrapes must fit the rules' window for exact figures


def perception_steps(fixture: str, corrected: bool = False, typed_by_proxy: bool = False) -> int:
    """Perception sentences of the chain the client gets (corrected: with the planted one rewritten).

    A detector that types steps itself (the oracle judge) counts the chain's own kinds; under any other
    the proxy's step typer decides, so its kinds are what the summary and the metrics count."""
    f = spec.get(fixture)
    sentences = list(f.chain)
    if corrected:
        assert f.planted is not None and f.correction is not None
        sentences = [*f.chain[: f.planted], f.correction.sentence, *f.correction.rest]
    if typed_by_proxy:
        return sum(classify_step(s.text) is StepKind.PERCEPTION for s in sentences)
    return sum(s.kind is StepKind.PERCEPTION for s in sentences)


@dataclass(frozen=True)
class Sent:
    """One request of the known traffic, and what faithproxy must count for it."""

    fixture: str
    headers: dict[str, str]
    detector: str | None  # the detector its steps count under; None: nothing is counted (mode off)
    detected: int = 0  # perception steps whose original text the detector flagged
    residual: dict[str, int] = field(default_factory=dict)  # delivered unfaithful or unchecked, by reason
    unchecked: dict[str, int] = field(default_factory=dict)  # no verdict, by reason
    corrected: bool = False
    stream: bool = True
    judge_mode: str = "ok"  # the local judge's fault mode while this request runs
    unsure: int = 0  # perception steps delivered unsure (a flag under the request's threshold)
    flag_confidence: float | None = None  # the local judge's P(UNFAITHFUL) in its logprobs, while it runs

    @property
    def perception(self) -> int:
        typed_by_proxy = self.detector is not None and not DETECTORS.resolve(self.detector).types_steps
        return perception_steps(self.fixture, self.corrected, typed_by_proxy)


P_GREEN = perception_steps("green_circle")
P_RED = perception_steps("red_circle")
TRAFFIC = (
    Sent("red_circle", {"X-Faithproxy-Judge": "claude"}, "judge", detected=1, corrected=True),
    Sent("red_circle", {"X-Faithproxy-Judge": "qwen"}, "judge", detected=1, corrected=True, stream=False),
    Sent("green_circle", {}, "judge"),
    Sent("blue_square", {"X-Faithproxy-Max-Retries": "2"}, "judge", detected=1, residual={"regeneration_failed": 1}),
    Sent("red_circle", {"X-Faithproxy-Mode": "detect"}, "judge", detected=1, residual={"not_corrected": 1}),
    Sent("red_circle", {"X-Faithproxy-Detector": "prompt"}, "prompt", detected=1, corrected=True),
    Sent(
        "green_circle",
        {"X-Faithproxy-Detector": "none"},
        "none",
        residual={"unchecked": P_GREEN},
        unchecked={"detector_none": P_GREEN},
    ),
    Sent(
        "red_circle", {}, "judge", residual={"unchecked": P_RED}, unchecked={"detector_error": P_RED}, judge_mode="500"
    ),
    Sent("green_circle", {"X-Faithproxy-Mode": "off"}, None),
    # the OpenAI-protocol judge shows P(UNFAITHFUL) 0.6 in its logprobs, under the request's 0.9: the
    # planted step is delivered unsure, not rewritten, not counted as detected
    Sent(
        "red_circle",
        {"X-Faithproxy-Judge": "qwen", "X-Faithproxy-Flag-Threshold": "0.9"},
        "judge",
        unsure=1,
        flag_confidence=0.6,
    ),
)
COUNTED = [s for s in TRAFFIC if s.detector is not None]

# Alerts the traffic must raise (pending: their `for` is minutes), by the thresholds in
# deploy/prometheus/rules/faithproxy-alerts.yml. judge: residual 5/21 > 5%; detected 4/21 is under
# 20% since the unsure request (it was 4/18 before that request was added), so FaithproxyDetectedUPRHigh
# must stay quiet; unchecked share without detector "none": 3/27 > 10%.
# FaithproxyDetectorErrors depends on how many
# calls the judge got (batching varies), so it is expected exactly when the proxy's own counters say so.
EXPECTED_ALERTS = {
    ("FaithproxyResidualUPRHigh", "judge"),
    ("FaithproxyUncheckedStepsHigh", ""),
}
DETECTOR_ERROR_THRESHOLD = 0.05


# ---- the truth ---------------------------------------------------------------------------------


def expected_ratio(kind: str, labels: dict[str, str], model: str, expr: str) -> float:
    """The figure the traffic implies for one result series (labels: its detector/model/reason)."""
    rows = [s for s in COUNTED if labels.get("detector", s.detector) == s.detector]
    if labels.get("model", model) != model:
        return math.nan
    denominator = sum(s.perception for s in rows)
    reason = labels.get("reason")
    if kind == "detected":
        numerator = sum(s.detected for s in rows)
    elif kind == "unsure":
        numerator = sum(s.unsure for s in rows)
    else:
        counts = [s.residual if kind == "residual" else s.unchecked for s in rows]
        skip = {"detector_none"} if 'reason!="detector_none"' in expr else set()
        numerator = sum(n for c in counts for r, n in c.items() if (reason is None or r == reason) and r not in skip)
    return assets.ratio(numerator, denominator)


def summary_of(response: Any, chunks: list[Any]) -> dict[str, Any]:
    if response is not None:
        return response.model_extra["faithfulness"]
    for chunk in reversed(chunks):
        summary = (chunk.model_extra or {}).get("faithfulness") or {}
        if "perception_steps" in summary:
            return summary
    raise AssertionError("no faithfulness summary in the stream")


# ---- the stack ------------------------------------------------------------------------------------


@dataclass
class Stack:
    proxy_url: str
    vllm_url: str
    model: str
    judge_app: Any
    client: AsyncOpenAI
    prometheus: PrometheusServer


@pytest.fixture
async def stack(prometheus_binary: str, vllm_server: Any, tmp_path: Path) -> AsyncIterator[Stack]:
    judge_app = create_judge_app(spec.oracle_json())
    async with running_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url:
        settings = local_judge_settings(vllm_server.base_url, judge_url)
        async with running_app(create_app(settings)) as proxy_url:
            config = render_config(
                {"faithproxy": proxy_url.removeprefix("http://"), "vllm": vllm_server.base_url.removeprefix("http://")}
            )
            prometheus = await asyncio.to_thread(start_prometheus, prometheus_binary, config, tmp_path)
            client = AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0, timeout=120)
            try:
                yield Stack(proxy_url, vllm_server.base_url, vllm_server.model, judge_app, client, prometheus)
            finally:
                await client.close()
                prometheus.stop()


async def wait_for(prometheus: PrometheusServer, what: str, check: Any, within_s: float = 60.0) -> None:
    """Polls `check()` (an async predicate) until it holds; fails with `what` and Prometheus's log."""
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{prometheus.log_tail()}")
        await asyncio.sleep(0.25)


async def scalar(prometheus: PrometheusServer, expr: str) -> float | None:
    result = await prometheus.query(expr)
    return float(result[0]["value"][1]) if result else None


async def send(stack: Stack, sent: Sent) -> dict[str, Any]:
    f = spec.get(sent.fixture)
    body = {
        "model": stack.model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": spec.data_url(sent.fixture)}},
                    {"type": "text", "text": f.question},
                ],
            }
        ],
        "max_tokens": 200,
        "temperature": 0.0,
    }
    stack.judge_app.state.judge.mode = sent.judge_mode
    stack.judge_app.state.judge.flag_confidence = sent.flag_confidence
    try:
        if not sent.stream:
            return summary_of(await stack.client.chat.completions.create(**body, extra_headers=sent.headers), [])
        chunks = [
            c async for c in await stack.client.chat.completions.create(**body, stream=True, extra_headers=sent.headers)
        ]
        return summary_of(None, chunks) if sent.detector else {}
    finally:
        stack.judge_app.state.judge.mode = "ok"
        stack.judge_app.state.judge.flag_confidence = None


# ---- the test --------------------------------------------------------------------------------------


async def test_every_dashboard_and_rule_expression_shows_the_known_traffic(stack: Stack) -> None:
    prom = stack.prometheus

    async def both_scraped() -> bool:
        return (await scalar(prom, 'count(up{job=~"faithproxy|vllm"} == 1)')) == 2

    # the first scrape must see the pre-initialised zeros, before any traffic
    await wait_for(prom, "the first scrape of faithproxy and vLLM", both_scraped)

    traffic_started = time.time()
    for sent in TRAFFIC:
        summary = await send(stack, sent)
        if sent.detector is None:
            continue
        got = (summary["perception_steps"], summary["unfaithful_detected"], summary["residual"])
        assert got == (sent.perception, sent.detected, sum(sent.residual.values())), (sent, summary)

    total = sum(s.perception for s in COUNTED)

    async def all_scraped() -> bool:
        steps = await scalar(prom, 'sum(faithproxy_steps_total{kind="perception"})')
        requests = await scalar(prom, "sum(faithproxy_requests_total)")
        return steps == total and requests == len(TRAFFIC)

    await wait_for(prom, f"{total} perception steps and {len(TRAFFIC)} requests in Prometheus", all_scraped)
    scraped = time.time()

    async def rules_evaluated() -> bool:
        stamps = [
            await scalar(prom, f"timestamp({name})")
            for name in ("faithproxy:upr_residual:ratio_rate5m", "faithproxy:unchecked_share:ratio_rate5m")
        ]
        return all(s is not None and s > scraped for s in stamps)

    await wait_for(prom, "a rule evaluation after the last scrape", rules_evaluated)
    assert time.time() - traffic_started < TRAFFIC_BUDGET_S, "traffic outlasted the rules' 5m window"

    failures: list[str] = []
    measured: list[str] = []
    covering = f"{int(time.time() - prom.started_at) + 60}s"  # a window that holds the whole test

    async def evaluate(where: str, expr: str) -> list[dict[str, Any]]:
        try:
            result = await prom.query(expr)
        except PrometheusError as exc:
            failures.append(f"{where}: {exc}")
            return []
        if not result:
            failures.append(f"{where}: no series for {expr}")
        return result

    def compare(where: str, kind: str, expr: str, result: list[dict[str, Any]]) -> None:
        # A 95% Wilson interval's bounds are not the ratio: each must lie on its side of it. All the
        # traffic came through the chat door: the other doors are 0/0 (NaN).
        bound = assets.interval_side(expr)
        for series in result:
            labels = {k: v for k, v in series["metric"].items() if k in ("detector", "model", "reason", "endpoint")}
            value = float(series["value"][1])
            if labels.pop("endpoint", CHAT_PATH) != CHAT_PATH:
                want = math.nan
            else:
                want = expected_ratio(kind, labels, stack.model, expr)
            side = {1: " (lower bound)", -1: " (upper bound)"}.get(bound, "")
            measured.append(f"{where} {labels or ''}: {value:.6g}{side} (expected {want:.6g})")
            if not assets.shows(value, want, bound):
                failures.append(f"{where} {labels}: {kind} ratio{side} {value!r}, expected {want!r}")

    # 1. every dashboard expression, as Grafana sends it with "All" selected: parses, returns series
    queries = assets.dashboard_queries()
    for q in queries:
        await evaluate(f"{q.panel} [{q.ref}]", assets.substitute(q.expr, rate_interval="1m", range_=covering))
    # 2. the UPR and unchecked-share panels over a window covering the test: exactly the known figures.
    #    The shadow panels count off-mode traffic checked after the fact, which this traffic has none of
    #    (their ratio is 0/0 here); their Wilson interval is checked by promtool in test_upr_queries.py and
    #    their counts against detect mode in the shadow proof (benchmarks/results/shadow-proof.json).
    known = [
        q
        for q in queries
        if ("UPR" in q.panel or "nchecked" in q.panel or "nsure" in q.panel)
        and 'source="shadow"' not in q.expr
        and quantity(q.expr)
    ]
    assert len(known) >= 8 and sum(quantity(q.expr) == "unsure" for q in known) == 2
    for q in known:
        expr = assets.substitute(q.expr, rate_interval=covering, range_=covering)
        kind = quantity(q.expr)
        assert kind is not None
        compare(f"panel {q.panel} [{q.ref}]", kind, q.expr, await evaluate(f"{q.panel} [{q.ref}]", expr))
    # 2b. the judge-bill panels over the same window: exactly the proxy's own counters over the known
    #     perception steps (judge tokens per step, calls per step, the cache hit share per judge)
    bill = judge_counters(await _get(f"{stack.proxy_url}/metrics"))
    judged = [q for q in queries if q.panel.startswith("Judge") and " / " in q.expr]
    assert len(judged) >= 5 and any(v > 0 for v in bill["cached_input"].values())
    for q in judged:
        expr = assets.substitute(q.expr, rate_interval=covering, range_=covering)
        for series in await evaluate(f"{q.panel} [{q.ref}]", expr):
            labels = series["metric"]
            value, want = float(series["value"][1]), expected_judge_figure(q.expr, labels, bill, total)
            measured.append(f"panel {q.panel} [{q.ref}] {labels or ''}: {value:.6g} (expected {want:.6g})")
            if not math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12):
                failures.append(f"panel {q.panel} [{q.ref}] {labels}: {value!r}, expected {want!r}")
    # 3. the variables' label values
    for name, (metric, label) in assets.variable_queries().items():
        values = await prom.api(f"label/{label}/values", **{"match[]": metric})
        if not values:
            failures.append(f"variable {name}: no values of {label} on {metric}")
    # 4. every rule: its expression (alerts: returns series exactly when the alert is expected) and,
    #    for recording rules, the recorded series; the UPR and unchecked-share ones exactly
    proxy_metrics = await _get(f"{stack.proxy_url}/metrics")
    errors = _sample_sum(proxy_metrics, "faithproxy_detector_errors_total", detector="judge")
    calls = _sample_sum(proxy_metrics, "faithproxy_detector_latency_seconds_count", detector="judge")
    expected_alerts = set(EXPECTED_ALERTS)
    if errors / calls > DETECTOR_ERROR_THRESHOLD:
        expected_alerts.add(("FaithproxyDetectorErrors", "judge"))
    batched = _sample_sum(proxy_metrics, "faithproxy_detector_batch_steps_sum", detector="judge")
    judge = stack.judge_app.state.judge
    measured.append(
        f"judge detector calls {calls:g} ({batched:g} steps), failed {errors:g}; "
        f"judge server: {judge.requests} requests, {judge.sentences_judged} sentences"
    )
    for rule in assets.rule_queries():
        where = f"rule {rule.name}"
        if rule.kind == "alert":
            firing = any(name == rule.name for name, _ in expected_alerts)
            result = await prom.query(rule.expr) if firing else []
            if firing and not result:
                failures.append(f"{where}: no series, but the traffic breaks its threshold")
            if not firing and await prom.query(rule.expr):
                failures.append(f"{where}: returns series, but the traffic should not raise it")
            continue
        result = await evaluate(where, rule.expr)
        recorded = await evaluate(f"{where} (recorded)", rule.name)
        shares = ("upr_", "unchecked_share", "unsure_share")
        kind = quantity(rule.expr) if any(part in rule.name for part in shares) else None
        if kind:
            compare(where, kind, rule.expr, result)
            compare(f"{where} (recorded)", kind, rule.expr, recorded)

    # 5. Prometheus's own view of the alerts
    async def alerts_settled() -> bool:
        return _active(await prom.api("alerts")) >= expected_alerts

    await wait_for(prom, f"alerts {sorted(expected_alerts)}", alerts_settled, within_s=20)
    active = _active(await prom.api("alerts"))
    if active != expected_alerts:
        failures.append(f"active alerts {sorted(active)}, expected {sorted(expected_alerts)}")

    # 6. the vllm:* names the dashboard uses are in the real vLLM's /metrics
    vllm_names = assets.exposition_names(await _get(f"{stack.vllm_url}/metrics"))
    used = {n for q in queries for n in assets.metric_names(q.expr) if n.startswith("vllm:")}
    missing = sorted(used - vllm_names)
    if missing:
        failures.append(f"vLLM's /metrics lacks {missing}")

    print("\n".join(measured))
    assert not failures, "\n".join(failures) + "\n\nmeasured:\n" + "\n".join(measured)


def judge_counters(text: str) -> dict[str, dict[str, float]]:
    """The proxy's judge-bill counters: kind → judge → tokens, and "calls" → judge → calls, summed over
    the other labels (`policy`: one series per key policy, pre-initialised at zero, so keeping the last
    line would read a policy's zero in place of another's count)."""
    out: dict[str, dict[str, float]] = {"calls": {}}
    for line in text.splitlines():
        for name in ("faithproxy_judge_tokens_total{", "faithproxy_judge_calls_total{"):
            if line.startswith(name):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
                kind = labels.get("kind", "calls")
                judges = out.setdefault(kind, {})
                judges[labels["judge"]] = judges.get(labels["judge"], 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_judge_counters_sum_over_policies() -> None:
    text = "\n".join(
        [
            'faithproxy_judge_tokens_total{judge="j",kind="input",policy="default"} 40.0',
            'faithproxy_judge_tokens_total{judge="j",kind="input",policy="mobile"} 2.0',
            'faithproxy_judge_tokens_total{judge="j",kind="input",policy="ops"} 0.0',
            'faithproxy_judge_calls_total{judge="j"} 3.0',
        ]
    )
    assert judge_counters(text) == {"calls": {"j": 3.0}, "input": {"j": 42.0}}


def expected_judge_figure(expr: str, labels: dict[str, str], bill: dict[str, dict[str, float]], steps: int) -> float:
    """What a judge-bill panel must show for the known traffic: its numerator summed from the proxy's
    counters (by the series' kind or judge, when it has one), over the perception steps or the prompt."""

    def total(kinds: list[str], judge: str | None = None) -> float:
        return sum(v for k in kinds for j, v in bill.get(k, {}).items() if judge is None or j == judge)

    prompt = ["input", "cached_input", "cache_creation"]
    if "faithproxy_judge_calls_total" in expr:
        return total(["calls"]) / steps
    if 'kind="cached_input"' in expr:  # the cache hit share, per judge
        return total(["cached_input"], labels["judge"]) / total(prompt, labels["judge"])
    if "kind" in labels:
        return total([labels["kind"]]) / steps
    kinds = [*prompt, "output"]
    if 'kind!="cached_input"' in expr:
        kinds.remove("cached_input")
    return total(kinds) / steps


async def _get(url: str) -> str:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(url)
        response.raise_for_status()
        return response.text


def _active(alerts: dict[str, Any]) -> set[tuple[str, str]]:
    return {(a["labels"]["alertname"], a["labels"].get("detector", "")) for a in alerts["alerts"]}


def _sample_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
