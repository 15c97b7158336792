"""Trace lines from concurrent writers never interleave."""

import json
import threading
from pathlib import Path

from faithproxy.server.traces import TRACE_SCHEMA_VERSION, TraceWriter


def test_concurrent_writers_produce_whole_lines(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "sub" / "t.jsonl")
    payload = "x" * 20_000  # larger than one write buffer

    def write(n: int) -> None:
        for i in range(50):
            writer.write({"id": f"{n}-{i}", "prompt": payload})

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = [json.loads(line) for line in (tmp_path / "sub" / "t.jsonl").read_text().splitlines()]
    assert len(records) == 400
    assert {r["id"] for r in records} == {f"{n}-{i}" for n in range(8) for i in range(50)}
    assert all(r["version"] == TRACE_SCHEMA_VERSION and r["prompt"] == payload for r in records)


def test_no_path_writes_nothing(tmp_path: Path) -> None:
    TraceWriter(None).write({"id": "x"})
    assert list(tmp_path.iterdir()) == []
