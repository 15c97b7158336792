"""benchmarks/performance/judge_client_cost.py measures every client it names, each call answered."""

from __future__ import annotations

from faithproxy.benchmarks.performance.judge_client_cost import CLIENTS, measure
from faithproxy.benchmarks.standins.judge_server import create_app, running_judge_server


async def test_every_client_is_measured() -> None:
    app = create_app({"unfaithful": []})
    app.state.judge.flag_confidence = 0.8
    async with running_judge_server(app) as url:
        clients = await measure(url, calls=2, blocks=1, warm_up=1)
    assert set(clients) == set(CLIENTS)
    assert all(row["cpu_us_per_call"] > 0 and row["wall_ms_per_call"] > 0 for row in clients.values())
