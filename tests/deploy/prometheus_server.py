"""A real Prometheus (Debian's binary) for tests: the repo's config, pointed at local targets.

`render_config` keeps deploy/prometheus/prometheus.yml as it is (jobs, paths, rule files) and changes
only what a test must: the scrape and evaluation intervals, static 127.0.0.1 targets in place of the
compose DNS discovery, and absolute rule-file paths. `start_prometheus` runs it on a free 127.0.0.1
port with a temporary data directory (started, awaited and stopped by `tinyvlm.processes`); `stop()`
ends it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.benchmarks.tinyvlm.processes import free_port
from tests.deploy import assets


class PrometheusError(RuntimeError):
    """Prometheus answered a query with an error (one that does not start raises ChildStartError)."""


def render_config(targets: dict[str, str], interval: str = "1s") -> str:
    """The repo's config with `targets` (job name → host:port) and `interval` for scraping and rules."""
    config: dict[str, Any] = yaml.safe_load(assets.PROMETHEUS_CONFIG.read_text())
    config["global"]["scrape_interval"] = interval
    config["global"]["evaluation_interval"] = interval
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    if jobs != set(targets):
        raise ValueError(f"the config scrapes {sorted(jobs)}; targets given for {sorted(targets)}")
    for job in config["scrape_configs"]:
        for key in [k for k in job if k.endswith("_sd_configs") or k == "static_configs"]:
            del job[key]
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
    base = assets.PROMETHEUS_CONFIG.parent
    config["rule_files"] = [str(base / pattern) for pattern in config["rule_files"]]
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class PrometheusServer:
    child: processes.Child
    port: int
    started_at: float  # time.time() when the process was started

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        return self.child.log_tail(chars)

    async def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/{path}; the `data` of a success, PrometheusError with Prometheus's message else."""
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.get(f"{self.url}/api/v1/{path}", params=params)
        body = response.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at the current time: the result vector (a scalar becomes one series)."""
        data = await self.api("query", query=expr)
        if data["resultType"] == "vector":
            return data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise PrometheusError(f"{expr}: unexpected result type {data['resultType']}")

    def stop(self) -> None:
        self.child.stop()


def start_prometheus(binary: str, config: str, workdir: Path, ready_timeout: float = 60.0) -> PrometheusServer:
    """Starts Prometheus on 127.0.0.1 with `config` and waits for /-/ready."""
    config_path = workdir / "prometheus.yml"
    config_path.write_text(config)
    port = free_port()
    started_at = time.time()
    child = processes.start(
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        workdir / "prometheus.log",
        f"http://127.0.0.1:{port}/-/ready",
        name="prometheus",
        timeout_s=ready_timeout,
    )
    return PrometheusServer(child, port, started_at)
