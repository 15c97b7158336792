"""probe_bench collect keeps what it gathered when a chain's request breaks: the chain is asked again,
and one that fails every try is reported, not a reason to lose the others."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from faithproxy.benchmarks.probes import probe_bench
from faithproxy.faithcore.errors import UpstreamError


async def test_a_broken_chain_is_retried_and_a_lost_one_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tries: dict[str, int] = {}
    items = probe_bench.fixture_items()
    flaky, lost = items[0]["id"], items[1]["id"]

    async def collect_one(item: dict[str, Any], *rest: Any) -> dict[str, Any]:
        tries[item["id"]] = tries.get(item["id"], 0) + 1
        if item["id"] == lost or (item["id"] == flaky and tries[flaky] == 1):
            raise UpstreamError("cannot reach upstream: ReadError")
        return {"id": item["id"]}

    monkeypatch.setattr(probe_bench, "collect_one", collect_one)
    args = argparse.Namespace(
        data="fixture", images=None, out=str(tmp_path / "out.jsonl"), concurrency=2,
        served_name="m", no_prompt=True, recipes=[],
    )  # fmt: skip
    records, failed = await probe_bench._collect(args, "http://127.0.0.1:9", [1])
    assert [r["id"] for r in records] == [item["id"] for item in items if item["id"] != lost]
    assert tries[flaky] == 2 and tries[lost] == probe_bench.COLLECT_TRIES
    assert failed == [f"{lost}: cannot reach upstream: ReadError"]
