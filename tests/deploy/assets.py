"""The files under deploy/ as data: the dashboard's PromQL, the rules, the compose file, metric names.

Both the static checks and the live Prometheus test read the deploy assets through here, so they agree
on what "every expression of the dashboard" and "every metric name used" mean.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "faithproxy.json"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
RULE_FILES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))

# Grafana's label variables are multi-valued with allValue ".*"; "All" is what a test substitutes.
LABEL_VARIABLE_VALUE = ".*"


@dataclass(frozen=True)
class PanelQuery:
    """One PromQL expression of the dashboard: a panel target or an annotation."""

    panel: str  # panel title, or "annotation: NAME"
    ref: str  # refId, or the annotation name
    expr: str
    instant: bool


@dataclass(frozen=True)
class RuleQuery:
    group: str
    name: str  # the recorded series or the alert name
    kind: str  # "record" | "alert"
    expr: str


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def iter_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(dashboard: dict[str, Any] | None = None) -> list[PanelQuery]:
    dashboard = dashboard or load_dashboard()
    queries = []
    for panel in iter_panels(dashboard):
        for target in panel.get("targets", []):
            if target.get("expr"):
                queries.append(PanelQuery(panel["title"], target["refId"], target["expr"], bool(target.get("instant"))))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            name = annotation["name"]
            queries.append(PanelQuery(f"annotation: {name}", name, annotation["expr"], False))
    return queries


def variable_queries(dashboard: dict[str, Any] | None = None) -> dict[str, tuple[str, str]]:
    """Query variables that read label values: name → (metric, label) of `label_values(metric, label)`."""
    dashboard = dashboard or load_dashboard()
    found = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query)
        match = re.fullmatch(r"\s*label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*(\w+)\s*\)\s*", text)
        if match is None:
            raise ValueError(f"variable {variable['name']}: unsupported query {text!r}")
        found[variable["name"]] = (match.group(1), match.group(2))
    return found


def quantity(expr: str) -> str | None:
    """Which known ratio an expression computes: detected, residual, unchecked, unsure; None: not a
    known one."""
    numerator, slash, denominator = expr.partition(" / ")
    if not slash or "perception" not in denominator:
        return None
    if 'verdict="unsure"' in numerator or "unsure_perception" in numerator:
        return "unsure"
    if "residual" in numerator:
        return "residual"
    if "unchecked" in numerator:
        return "unchecked"
    if 'verdict="unfaithful"' in numerator or "unfaithful_perception" in numerator or "upr_detected" in numerator:
        return "detected"
    return None


def interval_side(expr: str) -> int:
    """Which side of a 95% Wilson interval an expression computes (the ratio -/+ 1.96 * sqrt(...)):
    1 the lower bound, -1 the upper, 0 the ratio itself."""
    return (" - 1.96 * sqrt(" in expr) - (" + 1.96 * sqrt(" in expr)


def shows(value: float, want: float, side: int) -> bool:
    """Whether a panel's `value` agrees with the ratio `want` the traffic implies: NaN for a 0/0 (a door
    no traffic used), the ratio itself to rounding, or a bound (`side`, interval_side) in [0, 1] on its
    side of the ratio."""
    if math.isnan(want):
        return math.isnan(value)
    if not side:
        return math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12)
    return 0 <= value <= 1 and (value <= want if side > 0 else value >= want)


def ratio(numerator: float, denominator: float) -> float:
    """A ratio as PromQL computes it: 0/0 is NaN (a detector or door the traffic never used; the proxy
    pre-initialises its series at zero, so such a series exists and reads NaN)."""
    return numerator / denominator if denominator else math.nan


def rule_queries() -> list[RuleQuery]:
    rules = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                kind = "record" if "record" in rule else "alert"
                rules.append(RuleQuery(group["name"], rule[kind], kind, rule["expr"]))
    return rules


def substitute(expr: str, *, rate_interval: str, range_: str, variables: dict[str, str] | None = None) -> str:
    """The expression Grafana would send: its interval macros and label variables filled in."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("${__rate_interval}", rate_interval)
    expr = expr.replace("$__range", range_).replace("${__range}", range_)
    if "$__" in expr:
        raise ValueError(f"unsupported Grafana macro in {expr!r}")
    names = variables or {}

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return names.get(name, LABEL_VARIABLE_VALUE)

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


# ---- metric names ------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME = re.compile(r"(?<![\w:.$])[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Metric and recorded-series names an expression reads (faithproxy_*, vllm:*, level:metric:ops).

    Names inside strings (label values), label matchers and range selectors are not names; PromQL
    functions and keywords carry neither our prefixes nor a colon, so they fall out by themselves.
    """
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    return {n for n in _NAME.findall(text) if n.startswith(("faithproxy_", "vllm:")) or ":" in n}


def strings_in(node: Any) -> Iterator[str]:
    """Every string in a parsed YAML/JSON document (values and keys)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings_in(key)
            yield from strings_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings_in(item)


def exported_faithproxy_names() -> set[str]:
    """The sample names faithproxy's /metrics can carry, from server.metrics itself."""
    from faithproxy.server.observe.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry, ["judge"])
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def recorded_names() -> set[str]:
    return {rule.name for rule in rule_queries() if rule.kind == "record"}


def exposition_names(text: str) -> set[str]:
    """Sample names in a Prometheus text exposition (e.g. a real vLLM's /metrics)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names
