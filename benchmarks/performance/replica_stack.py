"""Real parts for the replicas test and benchmark: vLLM replicas of the fixture model, vLLM's router in
front of them, and what each replica's /metrics says it served.

    replicas = start_replicas(model_dir, 2, log_dir)          # real vLLM (CPU), started side by side
    router = start_router([r.base_url for r in replicas], "consistent_hash", log_dir / "router.log")
    before = await read_counters(replicas)                    # requests, prompt tokens, prefix cache

The router is `vllm-router` (PyPI, a Rust binary) from its own venv (scripts/install_router.sh;
$FAITHPROXY_VLLM_ROUTER names another binary). Its health checks run every second and one failure marks
a replica unhealthy, so a replica that dies leaves the hash ring within about a second (its defaults:
every 60 s, 3 failures). Requests name a fixture scene and a nonce (one pixel of its image), so no two
requests share a cached prefix past the few tokens before the image, and nearly every cache hit a
replica counts comes from the request's own earlier calls.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import re
import signal
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.benchmarks.tinyvlm.processes import Child, free_port
from faithproxy.benchmarks.tinyvlm.serve import VLLMServer, start_vllm

REPO = Path(__file__).resolve().parents[2]
ROUTER_BINARY = REPO / ".venv-router" / "bin" / "vllm-router"
# Fast failure detection for the fault test; the router's other settings are its defaults.
ROUTER_HEALTH_ARGS = (
    "--health-check-interval-secs", "1",
    "--health-failure-threshold", "1",
    "--health-success-threshold", "1",
    "--health-check-timeout-secs", "1",
)  # fmt: skip
# Scenes whose chain has a planted wrong perception step the local judge flags: a rewrite and a
# continuation follow (blue_square's rewrites never pass: every try is spent, then the chain goes on).
SCENES = ("red_circle", "square_and_circle", "blue_square")


def router_binary() -> Path:
    path = Path(os.environ.get("FAITHPROXY_VLLM_ROUTER", ROUTER_BINARY))
    if not path.exists():
        raise FileNotFoundError(f"vllm-router not found at {path}: run scripts/install_router.sh")
    return path


def start_replicas(model_dir: Path, count: int, log_dir: Path, health_timeout: float = 300.0) -> list[VLLMServer]:
    """`count` vLLM servers of the model, started at the same time; all or none (the others are stopped
    when one fails to come up)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(count) as pool:
        futures = [
            pool.submit(start_vllm, model_dir, log_path=log_dir / f"vllm-{i}.log", health_timeout=health_timeout)
            for i in range(count)
        ]
        started, errors = [], []
        for future in futures:
            try:
                started.append(future.result())
            except Exception as exc:  # noqa: BLE001 - raised below, once the others are stopped
                errors.append(exc)
    if errors:
        for server in started:
            server.stop()
        raise errors[0]
    return started


@dataclass
class Router:
    child: Child
    port: int
    policy: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.child.stop()


def start_router(
    workers: Sequence[str], policy: str, log_path: Path, timeout_s: float = 60.0, extra_args: Sequence[str] = ()
) -> Router:
    """`extra_args`: more of the router's own options (e.g. `--disable-retries`)."""
    port = free_port()
    argv = [
        str(router_binary()),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--policy", policy,
        "--worker-urls", *workers,
        # its own metrics listener takes a fixed port by default: two routers would collide
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()),
        *ROUTER_HEALTH_ARGS,
        *extra_args,
    ]  # fmt: skip
    child = processes.start(
        argv, log_path, f"http://127.0.0.1:{port}/health", name=f"vllm-router ({policy})", timeout_s=timeout_s
    )
    return Router(child, port, policy)


def kill(server: VLLMServer) -> None:
    """SIGKILL to the replica's whole process group: it dies as in an OOM kill, mid-stream."""
    os.killpg(os.getpgid(server.process.pid), signal.SIGKILL)
    server.process.wait(timeout=30)


# ---- what a replica served -----------------------------------------------------------------------

# Each counter: the metric's name and a label it must carry (summed over the rest). `calls` counts every
# HTTP call to the chat endpoint, an aborted stream included (vLLM's request_success does not count it).
COUNTERS = {
    "calls": ("http_request_size_bytes_count", 'handler="/v1/chat/completions"'),
    "prompt_tokens": ("vllm:prompt_tokens_total", ""),
    "cache_queries": ("vllm:prefix_cache_queries_total", ""),
    "cache_hits": ("vllm:prefix_cache_hits_total", ""),
}
_SAMPLE = re.compile(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.e+-]+)$", re.MULTILINE)


@dataclass(frozen=True)
class Counters:
    """One replica's counters (vLLM's /metrics, summed over their labels)."""

    calls: float = 0.0
    prompt_tokens: float = 0.0
    cache_queries: float = 0.0
    cache_hits: float = 0.0

    def __sub__(self, other: Counters) -> Counters:
        return Counters(*(getattr(self, f) - getattr(other, f) for f in COUNTERS))

    def __add__(self, other: Counters) -> Counters:
        return Counters(*(getattr(self, f) + getattr(other, f) for f in COUNTERS))


def parse_counters(text: str) -> Counters:
    sums = dict.fromkeys(COUNTERS, 0.0)
    for name, labels, value in _SAMPLE.findall(text):
        for field_name, (metric, label) in COUNTERS.items():
            if name == metric and label in labels:
                sums[field_name] += float(value)
    return Counters(**sums)


async def read_counters(servers: Sequence[VLLMServer]) -> list[Counters]:
    async with httpx.AsyncClient(timeout=10) as http:
        pages = await asyncio.gather(*(http.get(f"{s.base_url}/metrics") for s in servers))
    return [parse_counters(page.text) for page in pages]


def hit_rate(counters: Counters) -> float:
    return counters.cache_hits / counters.cache_queries if counters.cache_queries else 0.0


# ---- requests ----------------------------------------------------------------------------------


def fresh_image(scene: str, nonce: int) -> str:
    """The scene's image as a data URL with one corner pixel set from `nonce`: the picture the model was
    trained on (its chain does not change), but an image vLLM has never cached, so no two requests share
    a cached prefix past the few tokens before the image."""
    image = Image.open(io.BytesIO(spec.render_fixture_image(scene))).convert("RGB")
    image.putpixel((nonce % 8, (nonce // 8) % 8), (255 - nonce // 64 % 64, 255, 255 - nonce % 64))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def scene_request(scene: str, nonce: int, model: str = "fixture-vlm", **extra: Any) -> dict[str, Any]:
    """A streamed request about a fixture scene, its image made fresh by `nonce`."""
    fixture = spec.get(scene)
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": fresh_image(scene, nonce)}},
                    {"type": "text", "text": fixture.question},
                ],
            },
        ],
        "max_tokens": 200,
        "temperature": 0.0,
        "stream": True,
        **extra,
    }


@dataclass
class Placement:
    """Where the upstream calls of one request went: calls per replica."""

    calls: list[float] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.calls)

    @property
    def share_on_one(self) -> float:
        return max(self.calls) / self.total if self.total else 0.0

    @property
    def replica(self) -> int:
        return max(range(len(self.calls)), key=lambda i: self.calls[i])
