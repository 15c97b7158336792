"""The sha256 of a file, read in blocks: what results and training records name weights by."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    """Hex sha256 of the file's bytes, without reading it whole (weights run to hundreds of MB)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
