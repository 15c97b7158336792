"""MMEvalPro (Huang et al., 2024): multiple-choice triplets drawn from MMMU, ScienceQA and MathVista.

Each original question comes with a perception question (about what the image shows) and a knowledge
question (about what answering needs); a model is genuinely right only when it gets all three.

Layout: the release on the Hugging Face hub, i.e. Parquet files anywhere under the directory
(`DATA_DIR/data/MMMU-00000-of-00001.parquet`, ...; reading them needs `pyarrow`), or the same records
as JSON lines in `DATA_DIR/MMEvalPro.jsonl`. Columns: `index`, `triplet_id`, `eval_type` ("Origin" |
"Perception" | "Knowledge"), `source` (MMMU | ScienceQA | MathVista), `question`, `choices` (a list of
option texts), `answer` (the letter, or the text of the right option), `image` (in Parquet the hub's
image struct `{"bytes", "path"}`; in JSON lines a path relative to DATA_DIR). Images inside Parquet
files are written once to `DATA_DIR/.faithproxy-images/`.

Metrics: `genuine_accuracy` (triplets with all three right; triplets the run lacks a member of are left
out and counted in `incomplete_triplets`), `average_accuracy` (per question), and the accuracy of each
question type (`origin_accuracy`, `perception_accuracy`, `knowledge_accuracy`), and among complete
triplets whose original question is right, the share with the perception (knowledge) question right too
(`perception_consistency`, `knowledge_consistency`: a right answer for the wrong reasons shows as a low
value).

Loader options: `source` (keep one source only, e.g. `MMMU`), `instruction` (appended to prompts).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text
from faithproxy.benchmarks.evaluation.mcq import LETTERS, extract_choice, format_options, normalize_text

EVAL_TYPES = ("Origin", "Perception", "Knowledge")
IMAGE_CACHE = ".faithproxy-images"


def _records(data_dir: Path) -> Iterator[dict[str, Any]]:
    parquet = sorted(p for p in data_dir.rglob("*.parquet") if IMAGE_CACHE not in p.parts)
    if parquet:
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise RuntimeError("MMEvalPro: reading the Parquet release needs pyarrow (pip install pyarrow)") from exc
        for path in parquet:
            yield from pq.read_table(path).to_pylist()
        return
    jsonl = data_dir / "MMEvalPro.jsonl"
    if not jsonl.exists():
        raise FileNotFoundError(f"MMEvalPro: no *.parquet under {data_dir} and no {jsonl}")
    with jsonl.open(encoding="utf-8") as f:
        yield from (json.loads(line) for line in f if line.strip())


def _image_path(data_dir: Path, record: dict[str, Any]) -> Path | None:
    image = record.get("image")
    if image is None:
        return None
    if isinstance(image, str):
        return data_dir / image
    data, name = image.get("bytes"), image.get("path") or ""
    if data is None:
        return data_dir / name if name else None
    suffix = Path(name).suffix or (".png" if data[:4] == b"\x89PNG" else ".jpg")
    path = data_dir / IMAGE_CACHE / f"{record['index']}{suffix}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return path


def _gold(answer: str, choices: Sequence[str]) -> str:
    answer = str(answer).strip()
    if len(answer) == 1 and answer.upper() in LETTERS[: len(choices)]:
        return answer.upper()
    matches = [i for i, c in enumerate(choices) if normalize_text(c) == normalize_text(answer)]
    if len(matches) != 1:
        raise ValueError(f"MMEvalPro: answer {answer!r} is neither a letter nor one of the choices {choices!r}")
    return LETTERS[matches[0]]


def load(data_dir: Path, source: str = "", instruction: str = "") -> list[Item]:
    data_dir = Path(data_dir)
    items = []
    for record in _records(data_dir):
        if source and str(record.get("source", "")).lower() != source.lower():
            continue
        choices = [str(c) for c in record["choices"]]
        eval_type = str(record["eval_type"]).strip().capitalize()
        if eval_type not in EVAL_TYPES:
            raise ValueError(f"MMEvalPro: eval_type {record['eval_type']!r} is not one of {EVAL_TYPES}")
        question = str(record["question"]).strip()
        prompt = f"{question} Options: {format_options(choices)} {instruction}".strip()
        items.append(
            Item(
                id=f"mmevalpro-{record['index']}",
                question=question,
                prompt=prompt,
                answer=_gold(record["answer"], choices),
                image=_image_path(data_dir, record),
                options=tuple(choices),
                extra={"triplet": str(record["triplet_id"]), "eval_type": eval_type, "source": record.get("source")},
            )
        )
    return items


def correct(item: Item, prediction: Prediction) -> bool:
    return extract_choice(reply_text(prediction), item.options) == item.answer


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    triplets: dict[str, dict[str, bool]] = defaultdict(dict)
    by_type: dict[str, list[bool]] = {t: [] for t in EVAL_TYPES}
    unparsed = 0
    for item in items:
        choice = extract_choice(reply_text(predictions.get(item.id)), item.options)
        unparsed += choice is None
        right = choice == item.answer
        triplets[item.extra["triplet"]][item.extra["eval_type"]] = right
        by_type[item.extra["eval_type"]].append(right)
    complete = [t for t in triplets.values() if set(t) == set(EVAL_TYPES)]
    origin_right = [t for t in complete if t["Origin"]]
    return {
        "questions": len(items),
        "triplets": len(complete),
        "genuine_accuracy": ratio(sum(all(t.values()) for t in complete), len(complete)),
        "average_accuracy": ratio(sum(sum(v) for v in by_type.values()), len(items)),
        **{f"{t.lower()}_accuracy": ratio(sum(v), len(v)) for t, v in by_type.items()},
        "perception_consistency": ratio(sum(t["Perception"] for t in origin_right), len(origin_right)),
        "knowledge_consistency": ratio(sum(t["Knowledge"] for t in origin_right), len(origin_right)),
        "incomplete_triplets": len(triplets) - len(complete),
        "unparsed": unparsed,
    }
