"""Capture files left behind by captures that were cut off (clients/hidden_states.py `sweep_stale`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from faithproxy.clients.hidden_states import STALE_AFTER_S, HiddenStatesClient, sweep_stale


def _file(directory: Path, name: str, age_s: float) -> Path:
    path = directory / name
    path.write_bytes(b"x")
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def test_only_old_capture_files_and_their_locks_are_removed(tmp_path: Path) -> None:
    old = _file(tmp_path, "chatcmpl-a.safetensors", STALE_AFTER_S + 5)
    old_lock = _file(tmp_path, "chatcmpl-a.safetensors.lock", STALE_AFTER_S + 5)
    fresh = _file(tmp_path, "chatcmpl-b.safetensors", 1)
    other = _file(tmp_path, "notes.txt", STALE_AFTER_S + 5)
    assert sweep_stale(str(tmp_path), ".safetensors", STALE_AFTER_S) == 2
    assert not old.exists() and not old_lock.exists()
    assert fresh.exists() and other.exists()
    assert sweep_stale(str(tmp_path / "missing"), ".safetensors", STALE_AFTER_S) == 0


async def test_the_client_sweeps_the_directories_it_has_seen_at_most_once_a_minute(tmp_path: Path) -> None:
    client = HiddenStatesClient(generator=None, layers=[1])  # type: ignore[arg-type]  # no call is made
    first = _file(tmp_path, "chatcmpl-a.safetensors", STALE_AFTER_S + 5)
    await client._sweep(str(tmp_path / "chatcmpl-new.safetensors"))
    assert not first.exists()
    second = _file(tmp_path, "chatcmpl-b.safetensors", STALE_AFTER_S + 5)
    await client._sweep(str(tmp_path / "chatcmpl-newer.safetensors"))
    assert second.exists()  # within the minute: no second sweep
    keeping: Any = HiddenStatesClient(generator=None, layers=[1], keep_files=True)  # type: ignore[arg-type]
    await keeping._sweep(str(tmp_path / "chatcmpl-c.safetensors"))
    assert second.exists()  # a client told to keep files deletes none
