"""A real Prometheus (Debian's binary) for tests: the repo's config, pointed at local targets.

`render_config` keeps deploy/prometheus/prometheus.yml as it is (jobs, paths, rule files) and changes
only what a test must: the scrape and evaluation intervals, static 127.0.0.1 targets in place of the
compose DNS discovery, and absolute rule-file paths. `start_prometheus` runs it on a free 127.0.0.1
port with a temporary data directory; `stop()` ends it.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from faithproxy.tinyvlm.serve import free_port
from tests.deploy import assets


class PrometheusError(RuntimeError):
    """Prometheus did not start, or answered a query with an error."""


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
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    started_at: float  # time.time() when the process was started
    _log: Any = field(repr=False, default=None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

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

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None


def start_prometheus(binary: str, config: str, workdir: Path, ready_timeout: float = 60.0) -> PrometheusServer:
    """Starts Prometheus on 127.0.0.1 with `config` and waits for /-/ready."""
    config_path = workdir / "prometheus.yml"
    config_path.write_text(config)
    port = free_port()
    log_path = workdir / "prometheus.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    server = PrometheusServer(process, port, log_path, time.time(), log)
    deadline = time.monotonic() + ready_timeout
    while True:
        if process.poll() is not None:
            server.stop()
            raise PrometheusError(f"prometheus exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/-/ready", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise PrometheusError(f"prometheus not ready after {ready_timeout:.0f}s:\n{server.log_tail()}")
        time.sleep(0.2)
