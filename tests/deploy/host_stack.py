"""deploy/docker-compose.yml on host networking, for tests: every request goes to 127.0.0.1.

The compose file itself puts its services on a bridge network and finds them by name (`vllm`,
`fixture-judge`, `redis`), which tests must not send traffic to. This module renders the file's
services for one profile with `network_mode: host`: each listens on 127.0.0.1 on a port of its own
(`Ports`), every service name in a URL becomes 127.0.0.1 and that service's port, and Prometheus gets
the repo's config and rules with the Docker-DNS discovery replaced by static 127.0.0.1 targets. The
images, commands, environment, health checks, dependencies and volumes are the file's own, so a broken
service definition breaks the rendition too. Grafana is left out: its image cannot be pulled here
(deploy/README.md says what is checked instead).

Compose v1 (Debian's docker-compose 1.29) cannot merge `network_mode: host` over a service that has
`networks:` (the file's aliases), so this writes a whole file rather than an override.

Also a command line, for scripts/stack_scale_out.sh:  python -m tests.deploy.host_stack render PROFILE DIR
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx
import yaml

from faithproxy.benchmarks.tinyvlm.processes import free_port
from tests.deploy import assets

LOCAL_THIRD_PARTY = {
    "PROMETHEUS_IMAGE": "faithproxy-local/prometheus:debian",
    "REDIS_IMAGE": "faithproxy-local/redis:debian",
}
LEFT_OUT = {"grafana"}  # no image on this network; its provisioning is checked statically


@dataclass(frozen=True)
class Ports:
    """One 127.0.0.1 port per service. The defaults are fixed (a script's stack is found at the same
    addresses every time); tests take `Ports.free()`, so two runs on one machine do not collide."""

    faithproxy: int = 28080
    faithproxy_b: int = 28081
    vllm: int = 28000
    vllm_b: int = 28001
    router: int = 28010
    router_metrics: int = 28029
    judge: int = 28090
    prometheus: int = 28091
    redis: int = 28379

    @classmethod
    def free(cls) -> Ports:
        """Ports free on 127.0.0.1 now (the containers bind them moments later)."""
        return cls(*(free_port() for _ in fields(cls)))


# service -> (its port field, the port inside the compose file's network it replaces)
_LISTENS = {
    "vllm-cpu": ("vllm", 8000),
    "vllm-a": ("vllm", 8000),
    "vllm-b": ("vllm_b", 8000),
    "vllm-router": ("router", 8000),
    "fixture-judge": ("judge", 8090),
    "faithproxy-cpu": ("faithproxy", 8080),
    "faithproxy-a": ("faithproxy", 8080),
    "faithproxy-b": ("faithproxy_b", 8080),
    "prometheus": ("prometheus", 9090),
    "redis": ("redis", 6379),
}


def _urls(ports: Ports) -> dict[str, str]:
    """Service addresses of the compose network -> their loopback address here."""
    return {
        "http://vllm:8000": f"http://127.0.0.1:{ports.vllm}",
        "http://vllm-a:8000": f"http://127.0.0.1:{ports.vllm}",
        "http://vllm-b:8000": f"http://127.0.0.1:{ports.vllm_b}",
        "http://vllm-router:8000": f"http://127.0.0.1:{ports.router}",
        "http://fixture-judge:8090": f"http://127.0.0.1:{ports.judge}",
        "redis://redis:6379": f"redis://127.0.0.1:{ports.redis}",
        "--prometheus-host=0.0.0.0": "--prometheus-host=127.0.0.1",
        "--prometheus-port=29000": f"--prometheus-port={ports.router_metrics}",
        "--host=0.0.0.0": "--host=127.0.0.1",
        "--host 0.0.0.0": "--host 127.0.0.1",
    }


def _service(name: str, service: dict[str, Any], ports: Ports, workdir: Path) -> dict[str, Any]:
    service = {k: v for k, v in service.items() if k not in ("networks", "ports")}
    service["network_mode"] = "host"
    field_name, inner = _LISTENS[name]
    port = getattr(ports, field_name)
    text = json.dumps(service)
    for old, new in _urls(ports).items():
        text = text.replace(old, new)
    text = text.replace(f"127.0.0.1:{inner}/", f"127.0.0.1:{port}/")  # its own health check
    text = text.replace(f"--port {inner}", f"--port {port}").replace(f"--port={inner}", f"--port={port}")
    service = json.loads(text)
    if "build" in service:
        service["build"]["context"] = str((assets.DEPLOY / service["build"]["context"]).resolve())
    env = service.setdefault("environment", {})
    if name.startswith("vllm-") and name != "vllm-router":
        env["PORT"] = str(port)
        service["command"] = ["--host", "127.0.0.1"]  # serve.py: a later flag wins over its 0.0.0.0
    elif name.startswith("faithproxy-"):
        env["FAITHPROXY_HOST"] = "127.0.0.1"
        env["FAITHPROXY_PORT"] = str(port)
    elif name == "prometheus":
        service["command"] = [*service["command"], f"--web.listen-address=127.0.0.1:{port}"]
        service["volumes"] = [
            f"{workdir / 'prometheus'}:/etc/prometheus:ro" if v.startswith("./prometheus:") else v
            for v in service["volumes"]
        ]
    elif name == "redis":
        service["command"] = [*service["command"], "--bind", "127.0.0.1", "--port", str(port)]
        service["healthcheck"]["test"] = ["CMD", "redis-cli", "-p", str(port), "ping"]
    return service


def _prometheus_config(targets: dict[str, list[str]], scrape_interval: str) -> dict[str, Any]:
    config = yaml.safe_load(assets.PROMETHEUS_CONFIG.read_text())
    config["global"]["scrape_interval"] = scrape_interval
    config["global"]["evaluation_interval"] = scrape_interval
    for job in config["scrape_configs"]:
        job.pop("dns_sd_configs")
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
    return config


def render(profile: str, workdir: Path, ports: Ports = Ports(), scrape_interval: str = "1s") -> Path:
    """Writes workdir/docker-compose.yml (and workdir/prometheus/) for `profile`; returns the file."""
    compose = assets.load_compose()
    services = {
        name: _service(name, service, ports, workdir)
        for name, service in compose["services"].items()
        if profile in service.get("profiles", [profile]) and name not in LEFT_OUT
    }
    for service in services.values():
        depends = service.get("depends_on")
        if isinstance(depends, list):
            service["depends_on"] = [d for d in depends if d in services]
        elif isinstance(depends, dict):
            service["depends_on"] = {d: c for d, c in depends.items() if d in services}
    proxies = [f"127.0.0.1:{getattr(ports, _LISTENS[n][0])}" for n in services if n.startswith("faithproxy-")]
    vllms = [f"127.0.0.1:{getattr(ports, _LISTENS[n][0])}" for n in services if n in ("vllm-cpu", "vllm-a", "vllm-b")]
    prometheus_dir = workdir / "prometheus"
    shutil.copytree(assets.PROMETHEUS_CONFIG.parent, prometheus_dir, dirs_exist_ok=True)
    config = _prometheus_config({"faithproxy": proxies, "vllm": vllms}, scrape_interval)
    (prometheus_dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    for path in [workdir, *workdir.rglob("*")]:  # the containers' users (nobody) read it
        path.chmod(0o755 if path.is_dir() else 0o644)
    volumes = {name: None for name in compose.get("volumes", {})}
    out = workdir / "docker-compose.yml"
    out.write_text(yaml.safe_dump({"services": services, "volumes": volumes}, sort_keys=False))
    return out


def compose_command() -> list[str]:
    """Debian's docker-compose (1.29) when installed, else Compose v2 as a docker plug-in."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return ["docker", "compose"]


@dataclass
class HostStack:
    """One rendered profile under its own compose project: up, down -v, logs, what is left behind."""

    file: Path
    profile: str
    project: str
    ports: Ports = field(default_factory=Ports)
    env: dict[str, str] = field(default_factory=lambda: dict(LOCAL_THIRD_PARTY))

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [*compose_command(), "-p", self.project, "-f", str(self.file), "--profile", self.profile, *args]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env}
        )
        if check and result.returncode != 0:
            raise StackError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return result

    def up(self, services: list[str], timeout: float = 900) -> None:
        """Starts `services` (and what they depend on); compose waits for the health checks they name."""
        try:
            self.compose("up", "-d", "--no-build", *services, timeout=timeout)
        except (StackError, subprocess.TimeoutExpired) as exc:
            raise StackError(f"{exc}\n{self.logs()}") from exc

    def wait_ready(self, url: str, within_s: float = 180) -> None:
        """Polls `url` until it answers 200 (bounded); fails with the containers' logs."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise StackError(f"{url} did not answer 200 within {within_s:.0f} s\n{self.logs()}")

    def logs(self, tail: int = 40) -> str:
        return self.compose("logs", "--no-color", f"--tail={tail}", check=False).stdout[-12000:]

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=300)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes still labelled with this project."""
        label = f"label=com.docker.compose.project={self.project}"
        found = {}
        for kind, command in {
            "containers": ["docker", "ps", "-a", "-q", "--filter", label],
            "networks": ["docker", "network", "ls", "-q", "--filter", label],
            "volumes": ["docker", "volume", "ls", "-q", "--filter", label],
        }.items():
            out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
            found[kind] = out.split()
        return {kind: ids for kind, ids in found.items() if ids}

    def url(self, service_port: str) -> str:
        return f"http://127.0.0.1:{getattr(self.ports, service_port)}"


class StackError(RuntimeError):
    """A compose command failed or a service did not come up; carries the containers' logs."""


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[0] != "render":
        raise SystemExit("usage: python -m tests.deploy.host_stack render PROFILE DIR")
    workdir = Path(argv[2]).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(render(argv[1], workdir))
    print(json.dumps(asdict(Ports())))


if __name__ == "__main__":
    main(sys.argv[1:])
