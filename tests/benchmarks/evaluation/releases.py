"""Excerpts of the benchmarks' releases, unpacked into a folder the way a user's download unpacks.

The committed excerpts (tests/benchmarks/evaluation/data/, see its README.md for where every record
comes from) hold the records; what the releases ship as binary is made here at test time, so that the
repository carries no images: small PNGs where the release has image files, the Parquet files of hub
releases (with the PNG bytes in their image structs), MIRAGE's TSV (with base64 images).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

DATA = Path(__file__).parent / "data"
IMAGE_SIZE = (64, 48)  # width, height of every generated image (MM-GCoT's boxes are scaled by it)


def png(name: str, size: tuple[int, int] = IMAGE_SIZE) -> bytes:
    """A small PNG whose colour depends on `name`, so images differ from one another."""
    r, g, b = hashlib.sha256(name.encode()).digest()[:3]
    buffer = io.BytesIO()
    Image.new("RGB", size, (r, g, b)).save(buffer, format="PNG")
    return buffer.getvalue()


def _write_image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png(path.name))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def hallusionbench(dest: Path) -> Path:
    """The repository's HallusionBench.json (current `./VD/...` filenames) and hallusion_bench/ unzipped."""
    shutil.copy(DATA / "hallusionbench" / "HallusionBench.json", dest / "HallusionBench.json")
    for record in json.loads((dest / "HallusionBench.json").read_text()):
        if record["filename"]:
            _write_image(dest / "hallusion_bench" / record["filename"].removeprefix("./"))
    return dest


def hallusionbench_2023(dest: Path) -> Path:
    """The 2023 layout: filenames `./hallusion_bench/VD/...`, relative to the repository."""
    shutil.copy(DATA / "hallusionbench-2023" / "HallusionBench.json", dest / "HallusionBench.json")
    for record in json.loads((dest / "HallusionBench.json").read_text()):
        _write_image(dest / record["filename"].removeprefix("./"))
    return dest


def mmgcot(dest: Path) -> Path:
    """The repository's dataset/ folder and the Visual Genome images it names, under DATA_DIR."""
    shutil.copytree(DATA / "mmgcot" / "dataset", dest / "dataset")
    for file in (dest / "dataset").glob("*.json"):
        for record in json.loads(file.read_text()):
            _write_image(dest / record["img"])
    return dest


def mmevalpro(dest: Path) -> Path:
    """The hub release: data/*.parquet, images inside as `{"bytes", "path"}`."""
    rows = [
        {**r, "image": {"bytes": png(f"mmevalpro-{r['index']}"), "path": f"{r['index']}.png"}}
        for r in read_jsonl(DATA / "mmevalpro" / "records.jsonl")
    ]
    write_parquet(dest / "data" / "test-00000-of-00001.parquet", rows)
    return dest


def freak(dest: Path) -> Path:
    """The hub release as `datasets.load_dataset("./freak")` reads it: data/test-*.parquet."""
    rows = [
        {**r, "image": {"bytes": png(f"freak-{r['id']}"), "path": None}}
        for r in read_jsonl(DATA / "freak" / "records.jsonl")
    ]
    write_parquet(dest / "data" / "test-00000-of-00001.parquet", rows)
    return dest


MIRAGE_COLUMNS = (
    "index", "prompt", "image", "answer", "question_type", "choices", "normalized_classification",
    "refine_thinking", "rephrase_thinking_1", "rephrase_thinking_6",
)  # fmt: skip


def mirage(dest: Path, records: list[dict[str, Any]] | None = None, images: str = "base64") -> Path:
    """mirage.tsv with the images base64-encoded in the `image` column, or, with `images="files"`, the
    `mirage_images.zip` layout: the column names a file unzipped beside the TSV (`images/<index>.png`:
    the real archive's member names are not known here, only that the column holds them)."""
    records = records if records is not None else read_jsonl(DATA / "mirage" / "records.jsonl")
    dest.mkdir(parents=True, exist_ok=True)
    with (dest / "mirage.tsv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, MIRAGE_COLUMNS, delimiter="\t", extrasaction="ignore")
        writer.writeheader()
        for record in records:
            data = png(f"mirage-{record['index']}")
            if images == "files":
                image = f"images/{record['index']}.png"
                (dest / "images").mkdir(exist_ok=True)
                (dest / image).write_bytes(data)
            else:
                image = base64.b64encode(data).decode("ascii")
            writer.writerow({"image": image, **record})
    return dest


# Questions.csv rows 1, 2, 5 and 6 (two whole pairs) as MMVP publishes them: the values are quoted from
# other public repositories that read the file (data/README.md says which); the release is on the hub only.
MMVP_ROWS = [  # Index, Question, Options, Correct Answer
    ("1", "Are the butterfly's wings closer to being open or closed?", "(a) Open (b) Closed", "(a)"),
    ("2", "Are the butterfly's wings closer to being open or closed?", "(a) Open (b) Closed", "(b)"),
    ("5", "Is the dog facing left or right from the camera's perspective?", "(a) Left (b) Right", "(a)"),
    ("6", "Is the dog facing left or right from the camera's perspective?", "(a) Left (b) Right", "(b)"),
]


def mmvp(dest: Path) -> Path:
    """Questions.csv (first header spelled "lndex", as published) and MMVP Images/<Index>.jpg."""
    (dest / "MMVP Images").mkdir(parents=True)
    with (dest / "Questions.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["lndex", "Question", "Options", "Correct Answer"])
        writer.writerows(MMVP_ROWS)
    for index, *_ in MMVP_ROWS:
        Image.new("RGB", IMAGE_SIZE, (int(index) * 40, 0, 0)).save(dest / "MMVP Images" / f"{index}.jpg")
    return dest


RELEASES: dict[str, Callable[[Path], Path]] = {
    "mmvp": mmvp,
    "hallusionbench": hallusionbench,
    "mmevalpro": mmevalpro,
    "freak": freak,
    "mmgcot": mmgcot,
    "mirage": mirage,
}


def unpack(name: str, dest: Path) -> Path:
    """The excerpt of dataset `name`, laid out in `dest` as the release unpacks."""
    dest.mkdir(parents=True, exist_ok=True)
    return RELEASES[name](dest)
