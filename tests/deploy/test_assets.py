"""Static checks of deploy/ and the Dockerfile: every metric name used is exported, configs hang together.

No server runs here; promtool (a linter) does. The live proof, a real Prometheus evaluating every
expression against known traffic, is test_prometheus_live.py.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from faithproxy.server.settings import Settings
from tests.deploy import assets

# What the dashboard must show (issue 6), as words its panel titles carry.
REQUIRED_PANELS = (
    "Detected UPR",
    "Residual UPR",
    "UPR by detector and model",
    "Steps per second by kind and verdict",
    "Regeneration attempts",
    "Regenerated steps by outcome and tries",
    "Detector latency p50 / p95 / p99",
    "Request duration",
    "Time to first token",
    "unchecked",
    "Upstream (vLLM) errors",
    "Detector errors",
    "vLLM prefix-cache hit rate",
    "vLLM running / waiting requests",
    "Judge tokens per perception step",
    "Judge prompt-cache hit share",
    "Judge calls per perception step",
    "Unsure share",
    "Requests per second by endpoint",
    "Client connections closed by reason",
    "Internal errors (500) by door",
)


def _used_names(expressions: list[str]) -> set[str]:
    return set().union(*(assets.metric_names(e) for e in expressions)) if expressions else set()


def _check_names(names: set[str], where: str) -> None:
    exported = assets.exported_faithproxy_names()
    recorded = assets.recorded_names()
    unknown = sorted(n for n in names if n.startswith("faithproxy_") and n not in exported)
    assert not unknown, f"{where} uses metrics faithproxy does not export: {unknown}"
    unrecorded = sorted(n for n in names if ":" in n and not n.startswith("vllm:") and n not in recorded)
    assert not unrecorded, f"{where} uses series no recording rule records: {unrecorded}"


# ---- metric names ------------------------------------------------------------------------------


def test_metric_name_extraction() -> None:
    expr = (
        'sum by (le) (rate(faithproxy_detector_latency_seconds_bucket{detector=~"faithproxy_x|a:b"}[5m:1m]))'
        " / on() detector_model:faithproxy_perception_steps:rate5m + vllm:num_requests_running"
    )
    assert assets.metric_names(expr) == {
        "faithproxy_detector_latency_seconds_bucket",
        "detector_model:faithproxy_perception_steps:rate5m",
        "vllm:num_requests_running",
    }


def test_exported_names_come_from_server_metrics() -> None:
    exported = assets.exported_faithproxy_names()
    assert {"faithproxy_steps_total", "faithproxy_residual_steps_total", "faithproxy_requests_in_flight"} <= exported
    assert "faithproxy_detector_latency_seconds_bucket" in exported
    assert "faithproxy_steps" not in exported  # a counter is only ever read as ..._total


def test_dashboard_uses_only_exported_metrics() -> None:
    queries = assets.dashboard_queries()
    assert len(queries) > 30
    names = _used_names([q.expr for q in queries])
    assert {"faithproxy_steps_total", "faithproxy_residual_steps_total"} <= names
    _check_names(names, "the dashboard")
    for name, (metric, _label) in assets.variable_queries().items():
        _check_names({metric}, f"dashboard variable {name}")


def test_rules_use_only_exported_metrics() -> None:
    rules = assets.rule_queries()
    _check_names(_used_names([r.expr for r in rules]), "the rules")
    recorded = [r.name for r in rules if r.kind == "record"]
    assert len(recorded) == len(set(recorded)), "a series is recorded twice"
    for name in recorded:  # level:metric:operations
        assert re.fullmatch(r"[a-z_]+:[a-z_0-9]+:[a-z_0-9]+", name), name


def test_compose_and_prometheus_config_use_only_exported_metrics() -> None:
    # Not PromQL: only prefixed names count (a colon here is YAML's or a port's, not a recorded series).
    for path in (assets.COMPOSE, assets.PROMETHEUS_CONFIG):
        strings = list(assets.strings_in(yaml.safe_load(path.read_text())))
        _check_names({n for n in _used_names(strings) if n.startswith(("faithproxy_", "vllm:"))}, path.name)


def test_vllm_names_exist_in_installed_vllm() -> None:
    """vllm:* names the dashboard uses are defined by the installed vLLM (the live test reads /metrics)."""
    spec = importlib.util.find_spec("vllm")  # not imported: its import warnings would trip the strict run
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed in this interpreter (use .venv)")
    source = "\n".join(
        p.read_text(errors="replace") for p in Path(spec.submodule_search_locations[0]).glob("v1/metrics/*.py")
    )
    defined = set(re.findall(r'"(vllm:[a-z_:]+)"', source))
    used = {n for q in assets.dashboard_queries() for n in assets.metric_names(q.expr) if n.startswith("vllm:")}
    assert used
    for name in sorted(used):
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert name in defined or base in defined, f"{name} is not a metric of the installed vLLM"


# ---- dashboard -----------------------------------------------------------------------------------


def test_dashboard_panels_and_datasource() -> None:
    dashboard = assets.load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("model", "detector"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*", name

    panels = list(assets.iter_panels(dashboard))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    titles = " | ".join(p["title"] for p in panels)
    missing = [t for t in REQUIRED_PANELS if t.lower() not in titles.lower()]
    assert not missing, f"panels missing: {missing}"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_dashboard_expressions_fill_in_completely() -> None:
    for query in assets.dashboard_queries():
        expr = assets.substitute(query.expr, rate_interval="1m", range_="1h")
        assert "$" not in expr, (query.panel, expr)


def test_upr_panels_sum_before_dividing() -> None:
    """A replica-independent UPR: ratios of sums, never sums or averages of per-instance ratios."""
    for query in assets.dashboard_queries():
        if "UPR" in query.panel:
            numerator, _, denominator = query.expr.partition(" / ")
            assert numerator.startswith("sum") and denominator.startswith("sum"), query


def test_judge_bill_panels_sum_before_dividing() -> None:
    """Tokens per step and the cache hit share: ratios of sums over every replica, like the UPR."""
    judge = [q for q in assets.dashboard_queries() if q.panel.startswith("Judge") and " / " in q.expr]
    assert len(judge) >= 5
    for query in judge:
        numerator, _, denominator = query.expr.partition(" / ")
        denominator = re.sub(r"^ignoring \([^)]*\) group_left \(\) ", "", denominator)
        assert numerator.startswith("sum") and denominator.startswith("sum"), query
        assert "faithproxy_judge_" in numerator, query


# ---- Prometheus config and rules -------------------------------------------------------------------


def test_promtool_checks_rules(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", *map(str, assets.RULE_FILES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_checks_config(promtool: str) -> None:
    # check config also loads and checks the rule files it names
    result = subprocess.run(
        [promtool, "check", "config", str(assets.PROMETHEUS_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(assets.RULE_FILES)} rule files found" in result.stdout + result.stderr


def test_promtool_unit_tests_of_the_rules(promtool: str) -> None:
    """Alert thresholds, exclusions and volume guards on synthetic series (tests/deploy/alert_rules_test.yml)."""
    result = subprocess.run(
        [promtool, "test", "rules", str(Path(__file__).with_name("alert_rules_test.yml"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_config_scrapes_proxy_and_vllm_and_loads_every_rule_file() -> None:
    config = yaml.safe_load(assets.PROMETHEUS_CONFIG.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"faithproxy", "vllm"}
    loaded = {p for pattern in config["rule_files"] for p in assets.PROMETHEUS_CONFIG.parent.glob(pattern)}
    assert loaded == set(assets.RULE_FILES)
    datasource = yaml.safe_load((assets.DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    assert source["jsonData"]["timeInterval"] == config["global"]["scrape_interval"]


# ---- docker compose ---------------------------------------------------------------------------------


def _enabled(services: dict[str, Any], profile: str) -> dict[str, Any]:
    return {name: s for name, s in services.items() if not s.get("profiles") or profile in s["profiles"]}


def _names(name: str, service: dict[str, Any]) -> set[str]:
    """The DNS names a service answers to on the default network."""
    aliases = ((service.get("networks") or {}).get("default") or {}).get("aliases", [])
    return {name, *aliases}


def test_compose_profiles_each_run_one_vllm_and_one_faithproxy() -> None:
    compose = assets.load_compose()
    services = compose["services"]
    env = (assets.DEPLOY / ".env").read_text()
    assert re.search(r"^COMPOSE_PROFILES=gpu$", env, re.M), "docker compose up must mean the GPU stack"
    for profile in ("gpu", "cpu"):
        enabled = _enabled(services, profile)
        for name, service in enabled.items():
            depends_on = service.get("depends_on") or {}
            if isinstance(depends_on, list):
                depends_on = {dependency: {} for dependency in depends_on}
            for dependency, condition in depends_on.items():
                required = condition.get("required", True)
                assert dependency in enabled or not required, f"{profile}: {name} needs {dependency}"
        for dns in ("vllm", "faithproxy", "prometheus"):
            answering = [n for n, s in enabled.items() if dns in _names(n, s)]
            assert len(answering) == 1, f"{profile}: {dns} is answered by {answering}"
        assert {"prometheus", "grafana"} <= set(enabled)

    gpu = services["vllm"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "--enable-prefix-caching" in gpu["command"]
    assert "deploy" not in services["vllm-cpu"]


def test_compose_files_exist_and_mounts_match_provisioning() -> None:
    services = assets.load_compose()["services"]
    for name, service in services.items():
        build = service.get("build")
        if build:
            context = (assets.DEPLOY / build["context"]).resolve()
            assert (context / build["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (assets.DEPLOY / source).exists(), f"{name}: {source}"
    provider = yaml.safe_load((assets.DEPLOY / "grafana/provisioning/dashboards/faithproxy.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert f"./grafana/dashboards:{path}:ro" in services["grafana"]["volumes"]
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]


def test_compose_sets_only_real_faithproxy_settings() -> None:
    fields = {f"FAITHPROXY_{name.upper()}" for name in Settings.model_fields}
    services = assets.load_compose()["services"]
    for name in ("faithproxy", "faithproxy-cpu"):
        variables = [v for v in services[name]["environment"] if v.startswith("FAITHPROXY_")]
        unknown = sorted(set(variables) - fields)
        assert not unknown, f"{name}: not settings of faithproxy: {unknown}"
    cpu = services["faithproxy-cpu"]["environment"]
    Settings(judges=cpu["FAITHPROXY_JUDGES"])  # the CPU stack's judge list parses


# ---- images --------------------------------------------------------------------------------------------


def _final_stage(dockerfile: str) -> str:
    return re.split(r"^FROM ", dockerfile, flags=re.M)[-1]


def test_proxy_dockerfile_is_small_non_root_healthy_and_versioned() -> None:
    dockerfile = (assets.REPO / "Dockerfile").read_text()
    final = _final_stage(dockerfile)
    assert len(re.findall(r"^FROM ", dockerfile, re.M)) >= 2, "multi-stage build"
    assert re.search(r"^USER (?!root|0\b)\S+", final, re.M), "runs as a non-root user"
    assert "HEALTHCHECK" in final and "/healthz" in final
    version = tomllib.loads((assets.REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"ARG VERSION={version}" in final and 'org.opencontainers.image.version="${VERSION}"' in final
    # the build stage's venv, stripped of its build tools, is all the final stage takes from it
    assert "pip uninstall --yes setuptools wheel pip" in dockerfile and "COPY --from=build /opt/venv /opt/venv" in final
    assert "ARG BASE=python:3.11-slim" in dockerfile and final.startswith("${BASE}\n"), "FROM the BASE argument"
    assert not re.search(r"apt-get install|gcc|build-essential", final)
    documented = set(re.findall(r"FAITHPROXY_[A-Z_]+", dockerfile))
    fields = {f"FAITHPROXY_{name.upper()}" for name in Settings.model_fields}
    assert documented <= fields, sorted(documented - fields)


def test_cpu_vllm_image_copies_only_what_its_context_sends() -> None:
    folder = assets.DEPLOY / "vllm-cpu"
    dockerfile = (folder / "Dockerfile").read_text()
    ignore = (folder / "Dockerfile.dockerignore").read_text().splitlines()
    kept = {line[1:] for line in ignore if line.startswith("!")}
    sources = {s for m in re.findall(r"^COPY ((?:\S+ )+)\S+$", dockerfile, re.M) for s in m.split()}
    optional = {s for s in sources if "[" in s}  # a one-name glob: copied when it exists
    assert {re.sub(r"\[(\w)\]", r"\1", s) for s in sources} == kept
    assert "scripts/install_vllm.sh" in sources, "the image installs vLLM with the tests' recipe"
    assert optional == {"var/models/fixture-vl[m]"}
    for source in sources - optional:
        assert (assets.REPO / source).exists(), source


def test_proxy_image_builds_every_package_the_project_declares() -> None:
    """A folder left out of the build stage is missing from the wheel (package-dir points at nothing)."""
    dockerfile = (assets.REPO / "Dockerfile").read_text()
    declared = tomllib.loads((assets.REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile, re.M))
    assert set(declared.values()) <= copied
