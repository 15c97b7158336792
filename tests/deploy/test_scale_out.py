"""The compose profile scale-out, checked without Docker: vllm-router before two vLLM replicas, two
faithproxy replicas sharing Redis, Prometheus scraping every replica.

The file is parsed and its pieces are held against each other and against the code: the router's
worker URLs name the vLLM services, its flags are ones the installed router (`.venv-router`,
scripts/install_router.sh) takes, the proxies' variables are settings of server/settings.py that parse
and point at the router and at Redis, Prometheus's discovery names answer with both replicas, and
deploy/README.md documents every variable the file reads.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from faithproxy.benchmarks.performance.replica_stack import ROUTER_HEALTH_ARGS
from faithproxy.server.settings import Settings
from tests.deploy import assets

PROFILE = "scale-out"
ROUTER = assets.REPO / ".venv-router" / "bin" / "vllm-router"
_DEFAULT = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def _enabled(services: dict[str, Any]) -> dict[str, Any]:
    return {name: s for name, s in services.items() if not s.get("profiles") or PROFILE in s["profiles"]}


def _answering(enabled: dict[str, Any], dns: str) -> list[str]:
    """The services a DNS name resolves to on the default network (its own name and its aliases)."""
    found = []
    for name, service in enabled.items():
        aliases = ((service.get("networks") or {}).get("default") or {}).get("aliases", [])
        if dns == name or dns in aliases:
            found.append(name)
    return sorted(found)


def _with_defaults(value: str) -> str:
    """A compose value as it is with nothing set in the shell or .env: each ${VAR:-default} its default."""
    return _DEFAULT.sub(lambda m: m.group(2) or "", value)


def _flags(command: list[str]) -> dict[str, list[str]]:
    """`--flag=value` and `--flag value ...` items of a command list, by flag."""
    flags: dict[str, list[str]] = {}
    current = None
    for item in command:
        if item.startswith("--"):
            current, _, value = item.partition("=")
            flags[current] = [value] if value else []
        else:
            assert current is not None, f"a value before any flag: {item}"
            flags[current].append(item)
    return flags


@pytest.fixture(scope="module")
def enabled() -> dict[str, Any]:
    return _enabled(assets.load_compose()["services"])


def _proxies(enabled: dict[str, Any]) -> list[str]:
    return _answering(enabled, "faithproxy")


def test_the_profile_runs_a_router_two_vllm_two_proxies_redis_and_prometheus(enabled: dict[str, Any]) -> None:
    for name, service in enabled.items():
        depends_on = service.get("depends_on") or {}
        for dependency in depends_on:
            assert dependency in enabled, f"{name} needs {dependency}, which {PROFILE} does not run"
    assert len(_answering(enabled, "vllm")) == 2
    assert len(_proxies(enabled)) == 2
    for single in ("vllm-router", "redis", "prometheus", "grafana", "fixture-judge"):
        assert _answering(enabled, single) == [single]
    # The other profiles' services stay out of it.
    assert not {"vllm", "faithproxy", "vllm-cpu", "faithproxy-cpu"} & set(enabled)
    ports = [_with_defaults(port).rsplit(":", 1)[0] for p in _proxies(enabled) for port in enabled[p]["ports"]]
    assert len(ports) == len(set(ports)) == 2, f"each proxy replica on its own host port: {ports}"


def test_the_router_routes_to_both_vllm_replicas_and_the_proxies_to_the_router(enabled: dict[str, Any]) -> None:
    router = enabled["vllm-router"]
    flags = _flags(router["command"])
    replicas = _answering(enabled, "vllm")
    assert sorted(flags["--worker-urls"]) == [f"http://{name}:8000" for name in replicas]
    assert {k: v["condition"] for k, v in router["depends_on"].items()} == dict.fromkeys(replicas, "service_healthy")
    # A dead replica leaves as fast as in the test that proves resume behind the router.
    health = dict(zip(ROUTER_HEALTH_ARGS[::2], ROUTER_HEALTH_ARGS[1::2], strict=True))
    assert {flag: flags.get(flag) for flag in health} == {flag: [value] for flag, value in health.items()}
    # The default policy is the one that keeps a request's calls on one replica by its routing key.
    assert _with_defaults(flags["--policy"][0]) == "consistent_hash"
    router_url = f"http://vllm-router:{flags['--port'][0]}"
    for proxy in _proxies(enabled):
        environment = enabled[proxy]["environment"]
        assert environment["FAITHPROXY_UPSTREAM_URL"] == router_url
        assert enabled[proxy]["depends_on"]["vllm-router"]["condition"] == "service_healthy"


def test_the_proxies_share_redis_and_set_only_settings_that_parse(
    enabled: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = {f"FAITHPROXY_{name.upper()}" for name in Settings.model_fields}
    redis_command = enabled["redis"]["command"]
    assert "--save" in redis_command  # a cache: nothing written to disk
    traces = set()
    for proxy in _proxies(enabled):
        environment = {k: _with_defaults(str(v)) for k, v in enabled[proxy]["environment"].items()}
        unknown = sorted(k for k in environment if k.startswith("FAITHPROXY_") and k not in fields)
        assert not unknown, f"{proxy}: not settings of faithproxy: {unknown}"
        for key, value in environment.items():
            monkeypatch.setenv(key, value)
        settings = Settings()
        assert settings.reports_url is not None
        assert settings.reports_url.get_secret_value() == "redis://redis:6379/0"
        assert settings.routing_header == "x-session-id"  # the header vllm-router's consistent hash reads first
        assert settings.upstream_resume_attempts > 0
        assert settings.judges and settings.judges[0].base_url == "http://fixture-judge:8090/v1"
        assert enabled[proxy]["depends_on"]["redis"]["condition"] == "service_healthy"
        traces.add(settings.trace_path)
    assert len(traces) == 2, "two processes must not append to one trace file"


def test_prometheus_scrapes_every_replica_of_both(enabled: dict[str, Any]) -> None:
    config = yaml.safe_load(assets.PROMETHEUS_CONFIG.read_text())
    discovered = {}
    for job in config["scrape_configs"]:
        (sd,) = job["dns_sd_configs"]
        (name,) = sd["names"]
        discovered[job["job_name"]] = (_answering(enabled, name), sd["port"])
    assert discovered["faithproxy"] == (_proxies(enabled), 8080)
    assert discovered["vllm"] == (_answering(enabled, "vllm"), 8000)


def test_the_router_image_and_flags_are_the_installed_router_s(enabled: dict[str, Any]) -> None:
    if not ROUTER.is_file():
        pytest.fail(f"{ROUTER} is missing: run `bash scripts/install_router.sh` (scripts/test.sh does)")
    help_text = subprocess.run([str(ROUTER), "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    flags = _flags(enabled["vllm-router"]["command"])
    unknown = sorted(flag for flag in flags if not re.search(rf"(?m)^\s+{re.escape(flag)}\b", help_text))
    assert not unknown, f"vllm-router --help lists no {unknown}"
    policies = re.search(r"--policy \{([^}]*)\}", help_text)
    assert policies is not None and "consistent_hash" in policies.group(1).split(",")
    # One version everywhere: the image's default, the compose default, the install script the tests use.
    install = (assets.REPO / "scripts" / "install_router.sh").read_text()
    (version,) = re.findall(r"VLLM_ROUTER_VERSION:-([\d.]+)", install)
    dockerfile = (assets.DEPLOY / "vllm-router" / "Dockerfile").read_text()
    assert f"ARG VLLM_ROUTER_VERSION={version}" in dockerfile
    build = enabled["vllm-router"]["build"]
    assert _with_defaults(build["args"]["VLLM_ROUTER_VERSION"]) == version
    assert (assets.DEPLOY / build["context"] / build["dockerfile"]).resolve() == Path(
        assets.DEPLOY / "vllm-router" / "Dockerfile"
    ).resolve()


def test_the_deploy_readme_documents_every_variable_and_names_only_real_settings() -> None:
    readme = (assets.DEPLOY / "README.md").read_text()
    variables = set(re.findall(r"\$\{(\w+)", assets.COMPOSE.read_text()))
    undocumented = sorted(v for v in variables if f"`{v}`" not in readme)
    assert not undocumented, f"deploy/README.md does not document {undocumented}"
    fields = {f"FAITHPROXY_{name.upper()}" for name in Settings.model_fields}
    # The compose file's own variables for the image tag and the second replica's host port are no settings,
    # nor are the test suite's opt-ins for the container tests.
    not_settings = {"FAITHPROXY_VERSION", "FAITHPROXY_PORT_B"}
    not_settings |= {"FAITHPROXY_CONTAINER_TESTS", "FAITHPROXY_STACK_SCALE_OUT"}
    named = set(re.findall(r"FAITHPROXY_[A-Z0-9_]+", readme)) - not_settings
    assert sorted(named - fields) == []
