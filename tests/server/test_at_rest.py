"""Off mode and the app at rest load only what they use (issue 49): started in off mode with no judge, the
server has loaded none of the correction machinery (faithcore.correction, the segmenter and nltk, any
registered detector or regenerator), OpenTelemetry's SDK (no OTEL_* variables), Redis (no FAITHPROXY_REPORTS_URL),
Jinja2 (no report page asked for) or a judge's SDK (openai, anthropic), before or after serving off
requests; the first verified request loads what it needs. tests/test_extras.py checks the other side:
that the server loads no tool code and runs without the extras.

Each check runs in a fresh interpreter: the test process has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from faithproxy.detectors.registry import DETECTORS
from faithproxy.regenerators.registry import REGENERATORS

REPO = Path(__file__).resolve().parents[2]
# What an off-only server never needs (top-level libraries, and modules). OpenTelemetry by its SDK: the
# API alone comes with FastAPI itself where it is installed (FastAPI 0.16x imports it for its own telemetry).
LIBRARIES = ("nltk", "numpy", "redis", "jinja2", "openai", "anthropic")
MACHINERY = (
    "opentelemetry.sdk",
    "faithproxy.faithcore.correction",
    "faithproxy.faithcore.segmenter",
    "faithproxy.server.chain.session",
    *sorted({entry.target.partition(":")[0] for registry in (DETECTORS, REGENERATORS) for entry in registry.values()}),
)

_SERVE = """
import json, os, sys
import httpx
from fastapi.testclient import TestClient
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings

for name in list(os.environ):
    if name.startswith(("OTEL_", "FAITHPROXY_")):
        del os.environ[name]

def chunk(delta, finish=None):
    choice = {{"index": 0, "delta": delta, "finish_reason": finish}}
    payload = {{"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}}
    return b"data: " + json.dumps(payload).encode() + b"\\n\\n"

def vllm(request):
    if request.url.path.endswith("/models"):
        return httpx.Response(200, json={{"object": "list", "data": [{{"id": "m", "object": "model"}}]}})
    body = json.loads(request.content)
    text = "The image shows a red circle. So the answer is red."
    if not body.get("stream"):
        message = {{"role": "assistant", "content": text}}
        reply = {{"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                  "choices": [{{"index": 0, "message": message, "finish_reason": "stop"}}]}}
        return httpx.Response(200, json=reply)
    frames = chunk({{"role": "assistant", "content": text}}) + chunk({{}}, "stop") + b"data: [DONE]\\n\\n"
    return httpx.Response(200, content=frames, headers={{"content-type": "text/event-stream"}})

settings = Settings(upstream_url="http://vllm.test", default_mode="off", **{settings})
app = create_app(settings, upstream_transport=httpx.MockTransport(vllm))
ask = {{"model": "m", "messages": [{{"role": "user", "content": "What colour is the circle?"}}]}}
loaded = {{}}
with TestClient(app) as client:
    assert client.get("/healthz").status_code == 200
    loaded["at_rest"] = sorted(sys.modules)
    for stream in (True, False):
        response = client.post("/v1/chat/completions", json=ask | {{"stream": stream}})
        assert response.status_code == 200 and response.headers["x-faithproxy-mode"] == "off", response.text
    loaded["off_served"] = sorted(sys.modules)
    verified = {{"x-faithproxy-mode": "detect", "x-faithproxy-detector": "none"}}
    response = client.post("/v1/chat/completions", json=ask | {{"stream": True}}, headers=verified)
    assert response.status_code == 200 and response.headers["x-faithproxy-mode"] == "detect", response.text
    loaded["verified"] = sorted(sys.modules)
print(json.dumps(loaded))
"""


def _loaded(**settings: object) -> dict[str, list[str]]:
    script = _SERVE.format(settings=repr(settings))
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def _unused(modules: list[str]) -> list[str]:
    tops = {m.split(".")[0] for m in modules}
    return sorted({lib for lib in LIBRARIES if lib in tops} | {m for m in MACHINERY if m in modules})


@pytest.fixture(scope="module")
def off_only() -> dict[str, list[str]]:
    return _loaded()


def test_an_off_only_server_at_rest_loads_only_what_off_mode_uses(off_only: dict[str, list[str]]) -> None:
    assert _unused(off_only["at_rest"]) == []


def test_off_requests_load_nothing_more_of_it(off_only: dict[str, list[str]]) -> None:
    """Off requests with the default detector (the judge) named: its declarations are read from the
    registry (detectors/registry.py), its module is not imported."""
    assert _unused(off_only["off_served"]) == []


def test_the_first_verified_request_loads_the_machinery_it_needs(off_only: dict[str, list[str]]) -> None:
    verified = set(off_only["verified"])
    assert {"faithproxy.faithcore.correction", "faithproxy.detectors.none", "nltk"} <= verified
    assert not {"redis", "jinja2", "openai", "anthropic"} & {m.split(".")[0] for m in verified}
    assert "opentelemetry.sdk" not in verified


def test_detectors_built_on_first_use_get_their_series_then() -> None:
    """An off-only server pre-initialises no detector's series until its detectors are built; then each
    built detector's series appear, for the models learnt at start too."""
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry

    from faithproxy.server.app import DetectorsOnFirstUse, create_app
    from faithproxy.server.settings import Settings
    from faithproxy.testing import FakeUpstream, metric

    upstream = FakeUpstream()
    settings = Settings(upstream_url="http://vllm.test", default_mode="off")
    app = create_app(settings, registry=CollectorRegistry(), upstream_transport=upstream.transport())
    with TestClient(app) as client:
        detectors = app.state.faithproxy.detectors
        assert isinstance(detectors, DetectorsOnFirstUse) and detectors.built is None
        model = upstream.script.model
        at_rest = client.get("/metrics").text
        assert 'faithproxy_detector_latency_seconds_count{detector="none"}' not in at_rest
        headers = {"x-faithproxy-mode": "detect", "x-faithproxy-detector": "none"}
        ask = {"model": model, "messages": [{"role": "user", "content": "What is shown?"}]}
        assert client.post("/v1/chat/completions", json=ask, headers=headers).status_code == 200
        assert detectors.built is not None and {"none", "prompt", "consistency"} <= set(detectors.built)
        served = client.get("/metrics").text
        assert 'faithproxy_detector_latency_seconds_count{detector="prompt"} 0.0' in served
        assert metric(served, "faithproxy_steps_total", detector="none", model=model) > 0
        assert f'faithproxy_gated_steps_total{{detector="prompt",model="{model}"}} 0.0' in served
