"""What /metrics exposes, read through the running app as Prometheus reads it."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, running_app


async def test_metrics_carry_no_created_series(tmp_path: Path) -> None:
    vllm = FakeUpstream()
    settings = Settings(upstream_url="http://vllm.test", trace_path=str(tmp_path / "traces.jsonl"))
    app = create_app(settings, upstream_transport=vllm.transport())
    body = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}]}
    async with running_app(app) as url, httpx.AsyncClient(base_url=url) as http:
        # a request, so counters and histograms have children with samples, not just their names
        reply = await http.post("/v1/chat/completions", json=body, headers={"x-faithproxy-detector": "none"})
        assert reply.status_code == 200
        text = (await http.get("/metrics")).text
    families = list(text_string_to_metric_families(text))
    samples = [sample.name for family in families for sample in family.samples]
    assert any(family.type == "counter" for family in families)
    assert any(family.type == "histogram" for family in families)
    assert "faithproxy_requests_total" in samples  # the counters are there ...
    assert [name for name in samples if name.endswith("_created")] == []  # ... without their _created twins
    assert "_created" not in text
