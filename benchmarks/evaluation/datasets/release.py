"""Reading a benchmark's published release: what every loader shares.

A loader reads the files as a user downloads them and returns a `Release`: the items it can ask, the
number of records per split as published, and every `Problem` it met (a missing image, a record it
cannot read, a field value it does not know). A problem is never turned into an item: an item whose
image is missing would reach the model as a question without its figure and come back as a silent
wrong answer. `bench run` stops on the first look at the problems (`DatasetError`, one message naming
the file, the record and how many are affected) unless asked to `--skip-missing`, and then reports how
many records it left out; `bench validate` lists them all.

Also here: images stored inside the release (Parquet image structs, base64 TSV cells) written once to a
cache folder so that every item has a file to send, and the readers for those formats.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import csv
import functools
import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item

# What went wrong with a record; the kinds `bench validate` counts.
MISSING_FILE = "missing_file"
MISSING_IMAGE = "missing_image"
UNREADABLE_IMAGE = "unreadable_image"
UNREADABLE_RECORD = "unreadable_record"
UNKNOWN_VALUE = "unknown_value"
DUPLICATE_RECORD = "duplicate_record"
UNMATCHABLE_ANSWER = "unmatchable_answer"  # a note, not a problem

IMAGE_CACHE = ".faithproxy-images"


class DatasetError(ValueError):
    """The release cannot be used as it is; the message says what, where, and how many."""


@dataclass(frozen=True)
class Problem:
    kind: str
    record: str  # how a user finds the record: "HallusionBench.json #12 (VS/chart/3/1/0)"
    detail: str
    path: str | None = None  # the file concerned, when there is one

    def line(self) -> str:
        where = f" [{self.path}]" if self.path else ""
        return f"{self.kind}: {self.record}: {self.detail}{where}"


@dataclass
class Release:
    """What a loader read: usable items, records per split as published, and the problems."""

    dataset: str
    items: list[Item] = field(default_factory=list)
    splits: dict[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    # records kept and scored as the official script scores them, but worth knowing about (an answer no
    # reply can match under the official rule); they do not stop a run
    notes: list[Problem] = field(default_factory=list)

    def note(self, kind: str, record: str, detail: str) -> None:
        self.notes.append(Problem(kind, record, detail))

    def problem(self, kind: str, record: str, detail: str, path: Path | str | None = None) -> None:
        self.problems.append(Problem(kind, record, detail, str(path) if path is not None else None))

    def count(self, split: str) -> None:
        self.splits[split] = self.splits.get(split, 0) + 1

    @property
    def problem_counts(self) -> dict[str, int]:
        return dict(Counter(p.kind for p in self.problems))

    def error(self) -> DatasetError:
        """One message: how many records cannot be used, of which kinds, the first of them, what to do."""
        counts = ", ".join(f"{kind} {n}" for kind, n in sorted(self.problem_counts.items()))
        first = self.problems[0]
        return DatasetError(
            f"{self.dataset}: {len(self.problems)} record(s) cannot be used ({counts}); the first: {first.line()}. "
            f"`faithproxy bench validate --dataset {self.dataset} --data-dir DIR` lists them all; "
            f"`--skip-missing` leaves them out of the run and reports how many."
        )

    def require_clean(self) -> list[Item]:
        if self.problems:
            raise self.error()
        return self.items

    def report(self) -> dict[str, Any]:
        """The JSON `bench validate` prints."""
        return {
            "dataset": self.dataset,
            "records": dict(self.splits),
            "records_total": sum(self.splits.values()),
            "items": len(self.items),
            "problem_counts": self.problem_counts,
            "problems": [asdict(p) for p in self.problems],
            "notes": [asdict(p) for p in self.notes],
        }


def strict(read: Callable[..., Release]) -> Callable[..., list[Item]]:
    """`load` from `read`: the items of a clean release, DatasetError otherwise. The signature (the
    loader options `--loader-arg` accepts) is `read`'s."""

    @functools.wraps(read)
    def load(*args: Any, **kwargs: Any) -> list[Item]:
        return read(*args, **kwargs).require_clean()

    return load


def missing_release_file(release: Release, path: Path, what: str) -> Release:
    """A release without its main file: one problem, no items."""
    release.problem(MISSING_FILE, what, "not found (see docs/datasets.md for the layout)", path)
    return release


def unique_id(base: str, seen: set[str]) -> str:
    """`base`, or `base-2`, `base-3`, ... the first not yet taken (records that repeat an id keep apart)."""
    candidate, n = base, 1
    while candidate in seen:
        n += 1
        candidate = f"{base}-{n}"
    seen.add(candidate)
    return candidate


# ------------------------------------------------------------------------------------------ images

_CHECK_IMAGES: contextvars.ContextVar[bool] = contextvars.ContextVar("check_images", default=True)


@contextlib.contextmanager
def images_unchecked() -> Iterator[None]:
    """Read a release without checking its images: `bench score` needs the records, not the pixels."""
    token = _CHECK_IMAGES.set(False)
    try:
        yield
    finally:
        _CHECK_IMAGES.reset(token)


def image_problem(path: Path) -> tuple[str, str] | None:
    """(kind, detail) when `path` is not an image a model can be sent, else None (and always None
    under `images_unchecked`)."""
    if not _CHECK_IMAGES.get():
        return None
    if not path.is_file():
        return MISSING_IMAGE, "image not found"
    try:
        from PIL import Image

        with Image.open(path) as im:
            im.verify()
    except ImportError:  # without Pillow only existence and size can be checked
        return None if path.stat().st_size else (UNREADABLE_IMAGE, "empty file")
    except Exception as exc:  # PIL raises many kinds for a broken file
        return UNREADABLE_IMAGE, f"not a readable image ({type(exc).__name__}: {exc})"
    return None


def image_size(path: Path) -> tuple[int, int] | tuple[None, None]:
    """(width, height), or (None, None) for a file that is not there (`images_unchecked`)."""
    if not path.is_file():
        return None, None
    from PIL import Image

    with Image.open(path) as im:
        return im.size


def cache_dir(data_dir: Path) -> Path:
    """Where images stored inside the release are written: `DATA_DIR/.faithproxy-images`, or, when the
    release folder is read-only, a folder of the user cache named after it."""
    folder = data_dir / IMAGE_CACHE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
        return folder
    except OSError:
        digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        folder = base / "faithproxy" / "images" / digest
        folder.mkdir(parents=True, exist_ok=True)
        return folder


def _suffix(data: bytes, name: str = "") -> str:
    if Path(name).suffix:
        return Path(name).suffix.lower()
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return ".png"
    if data[:3] == b"\xff\xd8\xff":
        return ".jpg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    if data[:3] == b"GIF":
        return ".gif"
    return ".png"


def write_cached(folder: Path, name: str, data: bytes, original_name: str = "") -> Path:
    """The bytes as `folder/name.<ext>`, written only when absent or different."""
    path = folder / f"{name}{_suffix(data, original_name)}"
    if not path.exists() or path.stat().st_size != len(data):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def decode_base64(text: str) -> bytes | None:
    """The bytes of a base64 cell (a bare string or a data URL), or None when it is not base64."""
    text = text.strip()
    if text.startswith("data:"):
        text = text.partition(",")[2]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


# ------------------------------------------------------------------------------------------ formats


def read_parquet_rows(paths: Sequence[Path]) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    """(file, row number, record) of every row of the Parquet files, in order."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DatasetError("reading a Parquet release needs pyarrow (pip install pyarrow)") from exc
    for path in paths:
        for n, row in enumerate(pq.read_table(path).to_pylist()):
            yield path, n, row


def parquet_files(data_dir: Path) -> list[Path]:
    """Every `*.parquet` under the folder (a hub dataset keeps them in `data/`), the image cache aside."""
    return sorted(p for p in data_dir.rglob("*.parquet") if IMAGE_CACHE not in p.parts)


def read_tsv_rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(row number, record) of a TSV with a header; cells may hold whole base64 images."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with path.open(newline="", encoding="utf-8") as f:
        yield from enumerate(csv.DictReader(f, delimiter="\t"))


def read_json_records(path: Path) -> list[Any]:
    """A JSON list, a JSON object of records (values), or JSON lines."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        return list(data.values()) if all(isinstance(v, dict) for v in data.values()) else [data]
    return data if isinstance(data, list) else [data]


def first_existing(candidates: Iterable[Path]) -> Path | None:
    return next((p for p in candidates if p.exists()), None)


def as_text(value: Any) -> str:
    """A cell as text: None and NaN (pandas writes NaN for empty cells) are ""."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)


def percent(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(100 * value, digits)


def verdict_of(prediction: Mapping[str, Any] | str | None) -> Any:
    """A verdict an official judge already gave for this prediction (`bench score` on the official
    output format), or None."""
    return prediction.get("verdict") if isinstance(prediction, Mapping) else None
