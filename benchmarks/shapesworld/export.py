"""Labelled chains as JSONL, one record per line:

    {"id", "question", "image", "steps": [{"text", "kind", "faithful"}], "answer", "gold_answer"}

`question` is the prompt the model sees (text and lettered options). `image` is a file path when the
PNGs are written next to the records, else the SHA-256 of the PNG bytes (the same hash the proxy
computes for data-URL images, so records can be joined with proxy logs). `faithful` is null for
reasoning steps. `answer` is the chain's letter, `gold_answer` the correct one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.shapesworld.chains import Chain
from faithproxy.benchmarks.shapesworld.questions import Question
from faithproxy.benchmarks.shapesworld.scenes import Scene, png_bytes, render


def image_sha256(scene: Scene) -> str:
    return hashlib.sha256(png_bytes(render(scene))).hexdigest()


def image_filename(scene: Scene) -> str:
    """Unique per (seed, index, canvas): the same scene index at two sizes is two images."""
    return f"{scene.seed}-{scene.index}-{scene.width}x{scene.height}.png"


def chain_record(record_id: str, question: Question, chain: Chain, image: str) -> dict[str, Any]:
    return {
        "id": record_id,
        "question": question.prompt,
        "image": image,
        "steps": [{"text": s.text, "kind": s.kind, "faithful": s.faithful} for s in chain.steps],
        "answer": chain.answer,
        "gold_answer": question.gold_letter,
    }


def write_chains_jsonl(
    path: str | Path, items: Iterable[tuple[str, Scene, Question, Chain]], image_dir: str | Path | None = None
) -> int:
    """Write one record per (id, scene, question, chain); returns the number written.

    With `image_dir`, each scene's PNG is saved there (see `image_filename`) and the record holds its
    path; without, the record holds the PNG's SHA-256.
    """
    path = Path(path)
    images = Path(image_dir) if image_dir is not None else None
    if images is not None:
        images.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w", encoding="utf-8") as out:
        for record_id, scene, question, chain in items:
            if images is None:
                image = image_sha256(scene)
            else:
                image_path = images / image_filename(scene)
                if not image_path.exists():
                    image_path.write_bytes(png_bytes(render(scene)))
                image = str(image_path)
            out.write(json.dumps(chain_record(record_id, question, chain, image), ensure_ascii=False) + "\n")
            written += 1
    return written
