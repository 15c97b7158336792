"""The compose stack's `cpu` profile, built and started in Docker, driven through the OpenAI SDK.

scripts/build_images.sh builds the images (from the Debian-made base when no registry answers, with
Debian's Prometheus standing in for prom/prometheus through PROMETHEUS_IMAGE); tests.deploy.host_stack
renders the profile onto host networking, so every request goes to 127.0.0.1. The containers: vLLM-CPU
serving the fixture model, the fixture judge, faithproxy, Prometheus running the repo's config and
rules. Grafana is not among them (its image cannot be pulled here): every query of its dashboard is run
against the stack's Prometheus instead, as Grafana would send it with "All" selected.

The stack is torn down with `down -v` whatever happens, and the teardown fails when a container,
network or volume of the project is left.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from tests.deploy import assets
from tests.deploy.assets import quantity
from tests.deploy.docker_env import build_images, require_docker
from tests.deploy.host_stack import HostStack, Ports, render

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(3600),  # image builds and vLLM starts in the fixture: tens of minutes on a busy machine
]

SERVICES = ["vllm-cpu", "fixture-judge", "faithproxy-cpu", "prometheus"]
MODEL = "fixture-vlm"

# Known traffic: (fixture, headers, stream). Every mode and detector the proxy can run without a fault
# injected into the judge (the judge runs in its own container here). The consistency detector is built
# too (a generator is configured) but sent nothing: its series are pre-initialised at zero and read 0/0
# (NaN); tests/integration/test_consistency_vllm.py drives it against real vLLM.
TRAFFIC = (
    ("red_circle", {"X-Faithproxy-Mode": "correct"}, True),
    ("green_circle", {}, True),
    ("blue_square", {"X-Faithproxy-Max-Retries": "2"}, False),
    ("red_circle", {"X-Faithproxy-Mode": "detect"}, True),
    ("red_circle", {"X-Faithproxy-Detector": "prompt"}, True),
    ("green_circle", {"X-Faithproxy-Detector": "none"}, True),
    ("green_circle", {"X-Faithproxy-Mode": "off"}, True),
)


@dataclass
class Sent:
    fixture: str
    headers: dict[str, str]
    text: str
    summary: dict[str, Any]  # the faithfulness summary; empty for mode off


@pytest.fixture(scope="module")
def cpu_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostStack]:
    require_docker()
    build_images("proxy", "vllm-cpu", "prometheus")
    workdir = tmp_path_factory.mktemp("stack-cpu")
    ports = Ports.free()
    stack = HostStack(render("cpu", workdir, ports), "cpu", f"faithproxy-test-{os.getpid()}", ports)
    stack.started_at = time.time()  # type: ignore[attr-defined]
    try:
        stack.up(SERVICES)
        stack.wait_ready(f"{stack.url('faithproxy')}/readyz")
        stack.wait_ready(f"{stack.url('prometheus')}/-/ready")
        yield stack
    finally:
        stack.down()
        left = stack.leftovers()
        assert not left, f"`down -v` left {left} of project {stack.project}"


def prometheus_query(stack: HostStack, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{stack.url('prometheus')}/api/v1/query", params={"query": expr}, timeout=30)
    body = response.json()
    if body.get("status") != "success":
        raise AssertionError(f"{expr}: {body.get('error', body)}")
    return body["data"]["result"]


def scalar(stack: HostStack, expr: str) -> float | None:
    result = prometheus_query(stack, expr)
    return float(result[0]["value"][1]) if result else None


def wait_for(stack: HostStack, what: str, check: Any, within_s: float = 90) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{stack.logs()}")
        time.sleep(0.5)


def send(client: OpenAI, fixture: str, headers: dict[str, str], stream: bool) -> Sent:
    body: Any = {
        "model": MODEL,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": spec.data_url(fixture)}},
                    {"type": "text", "text": spec.get(fixture).question},
                ],
            }
        ],
        "max_tokens": 200,
        "temperature": 0.0,
    }
    if not stream:
        reply = client.chat.completions.create(**body, extra_headers=headers)
        return Sent(fixture, headers, reply.choices[0].message.content or "", reply.model_extra["faithfulness"])
    text, summary = [], {}
    for chunk in client.chat.completions.create(**body, stream=True, extra_headers=headers):
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
        found = (chunk.model_extra or {}).get("faithfulness") or {}
        if "perception_steps" in found:
            summary = found
    return Sent(fixture, headers, "".join(text), summary)


@pytest.fixture(scope="module")
def traffic(cpu_stack: HostStack) -> list[Sent]:
    """The known traffic, sent once Prometheus has scraped the proxy's pre-initialised zeros."""
    wait_for(cpu_stack, "the first scrape of faithproxy and vLLM", lambda: scalar(cpu_stack, "sum(up)") == 2)
    client = OpenAI(base_url=f"{cpu_stack.url('faithproxy')}/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        return [send(client, *request) for request in TRAFFIC]
    finally:
        client.close()


def test_streamed_chat_in_correct_mode_is_corrected_with_verified_steps(traffic: list[Sent]) -> None:
    sent = traffic[0]
    fixture = spec.get(sent.fixture)
    assert sent.headers == {"X-Faithproxy-Mode": "correct"}
    assert sent.text == spec.corrected_chain_text(fixture)
    summary = sent.summary
    assert (summary["mode"], summary["detector"]) == ("correct", "judge")
    assert (summary["unfaithful_detected"], summary["residual"], summary["fixed"]) == (1, 0, 1)
    perception = [s for s in summary["steps"] if s["kind"] == "perception"]
    assert len(perception) == summary["perception_steps"] > 1
    assert all(s["verdict"] == "faithful" for s in perception), perception  # every one checked, none left bad
    assert [s["detected"] for s in perception].count("unfaithful") == 1


def expected(kind: str, labels: dict[str, str], counted: list[Sent], door: str) -> float | None:
    """The ratio the traffic implies for a series (None: a kind or label this test does not compute).
    `door` is the endpoint all the traffic came through; another endpoint had none (0/0, NaN)."""
    if kind not in ("detected", "residual") or "reason" in labels or labels.get("model", MODEL) != MODEL:
        return None
    if labels.get("endpoint", door) != door:
        return math.nan
    rows = [s.summary for s in counted if labels.get("detector", s.summary["detector"]) == s.summary["detector"]]
    numerator = sum(r["unfaithful_detected" if kind == "detected" else "residual"] for r in rows)
    return assets.ratio(numerator, sum(r["perception_steps"] for r in rows))


def test_prometheus_holds_the_upr_series_and_every_dashboard_query_returns_data(
    cpu_stack: HostStack, traffic: list[Sent]
) -> None:
    counted = [s for s in traffic if s.summary]
    total = sum(s.summary["perception_steps"] for s in counted)
    assert len(counted) == len(TRAFFIC) - 1 and total > 0

    def scraped() -> bool:
        steps = scalar(cpu_stack, 'sum(faithproxy_steps_total{kind="perception"})')
        return steps == total and scalar(cpu_stack, "sum(faithproxy_requests_total)") == len(TRAFFIC)

    wait_for(cpu_stack, f"{total} perception steps and {len(TRAFFIC)} requests in Prometheus", scraped)
    after = time.time()

    def recorded() -> bool:
        stamps = [scalar(cpu_stack, f"timestamp({n})") for n in ("faithproxy:upr_detected:ratio_rate5m",)]
        return all(s is not None and s > after for s in stamps)

    wait_for(cpu_stack, "a rule evaluation after the last scrape", recorded)
    for name in ("faithproxy:upr_detected:ratio_rate5m", "faithproxy:upr_residual:ratio_rate5m"):
        value = scalar(cpu_stack, name)
        assert value is not None and 0 <= value <= 1, (name, value)

    covering = f"{int(time.time() - cpu_stack.started_at) + 60}s"  # type: ignore[attr-defined]
    (door,) = [
        s["metric"]["endpoint"]
        for s in prometheus_query(cpu_stack, "sum by (endpoint) (faithproxy_requests_total) > 0")
    ]
    failures, compared = [], 0
    for q in assets.dashboard_queries():
        where = f"{q.panel} [{q.ref}]"
        try:
            result = prometheus_query(cpu_stack, assets.substitute(q.expr, rate_interval=covering, range_=covering))
        except AssertionError as exc:
            failures.append(f"{where}: {exc}")
            continue
        if not result:
            failures.append(f"{where}: no data for {q.expr}")
        # The shadow panels count off-mode traffic checked after the fact, which this traffic has none of
        # (their ratio is 0/0 here, as in test_prometheus_live.py): they must return series, but their
        # figures are checked by promtool (test_upr_queries.py) and the shadow proof, not against this.
        kind = quantity(q.expr) if 'source="shadow"' not in q.expr else None
        # A 95% Wilson interval's bounds are not the ratio: each must lie on its side of it.
        bound = assets.interval_side(q.expr)
        for series in result if kind else []:
            labels = {k: v for k, v in series["metric"].items() if k in ("detector", "model", "reason", "endpoint")}
            want = expected(kind, labels, counted, door)
            if want is None:
                continue
            compared += 1
            value = float(series["value"][1])
            if not assets.shows(value, want, bound):
                side = {1: " (lower bound)", -1: " (upper bound)"}.get(bound, "")
                failures.append(f"{where} {labels}: {kind}{side} {value!r}, the traffic gives {want!r}")
    assert not failures, "\n".join(failures)
    assert compared >= 4, "the UPR panels were not compared with the traffic"


def test_grafana_provisioning_parses_and_names_the_provisioned_datasource() -> None:
    """Grafana itself is not installable here: its files are checked for what Grafana would read."""
    import yaml

    provisioning = assets.DEPLOY / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "faithproxy.yml").read_text())["providers"]
    assert provider["type"] == "file" and Path(provider["options"]["path"]).name == "dashboards"
    dashboard = assets.load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == source["type"]
    referenced = set()
    for panel in assets.iter_panels(dashboard):
        for node in [panel, *panel.get("targets", [])]:
            ds = node.get("datasource")
            if isinstance(ds, dict) and ds.get("type") != "datasource":  # rows and "-- Grafana --" aside
                referenced.add((ds.get("type"), ds.get("uid")))
    assert referenced and all(kind == source["type"] for kind, _ in referenced), referenced
    uids = {uid for _, uid in referenced}
    assert uids <= {"${datasource}", "$datasource", source.get("uid")}, uids
