"""MMEvalPro (Huang et al., 2024): question triplets drawn from MMMU, ScienceQA and MathVista.

Each original question comes with a perception question (what the image shows) and a knowledge question
(what answering needs); a model is genuinely right only when it gets all three.

Layout: the hub release (MM-Diagnose/MMEvalPro) as downloaded, Parquet files anywhere under DATA_DIR
(`DATA_DIR/data/*.parquet`; reading them needs `pyarrow`). Columns: `index`, `triplet_id`, `question`,
`choices` (list of option texts), `answer`, `image` (the hub's image struct `{"bytes", "path"}`),
`source` (MMMU | MathVista | ScienceQA), `question_category`, `eval_type` (Origin | Perception |
Knowledge). The images are written once to `DATA_DIR/.faithproxy-images/` (release.cache_dir).

Scoring is the official `auto_score.py`'s: a question is right when the model's output equals the
`answer` field exactly (`answer == model_output`); we take the model's output to be the option letter
its reply chooses (`mcq.extract_choice`), or, for a question without choices, the reply's final answer
text. Per source (MMMU, MathVista, ScienceQA) and over all questions ("Micro_Average"):
`genuine_accuracy_score` (triplets, grouped by `triplet_id`, with every member right),
`average_score` (questions), `origin_score`, `perception_score`, `knowledge_score` (questions of that
type); "Macro_Average" is the mean of the three sources' figures. Like the official script, figures are
percentages rounded to 2 places, and the macro average is taken over the rounded per-source figures.

The release holds answers that no chosen letter can ever equal (a letter beyond the choices, a
lower-case letter, an option's text such as "South Carolina"): the official scorer counts those
questions wrong whatever the reply, and so do we, but never silently: `bench validate` lists them as
notes and the metrics count them (`unmatchable_answers`).

`bench score` on the official output format (`demo_model_output.json`: `index`, `triplet_id`,
`model_output`, `answer`, `source`, `eval_type`) scores the rows as they are, exactly like
`auto_score.py`, and only reports how many of them disagree with the release.

Loader options: `source` (keep one source, e.g. `MMMU`), `eval_type` (keep one type, e.g.
`Perception`), `instruction` (appended to prompts).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, reply_text
from faithproxy.benchmarks.evaluation.datasets.release import (
    DUPLICATE_RECORD,
    MISSING_IMAGE,
    UNKNOWN_VALUE,
    UNMATCHABLE_ANSWER,
    UNREADABLE_RECORD,
    Release,
    as_text,
    cache_dir,
    image_problem,
    missing_release_file,
    parquet_files,
    read_parquet_rows,
    strict,
    write_cached,
)
from faithproxy.benchmarks.evaluation.mcq import LETTERS, extract_choice, final_answer_span, format_options

OFFICIAL = ("Micro_Average", "Macro_Average", "MMMU", "MathVista", "ScienceQA")
EVAL_TYPES = ("Origin", "Perception", "Knowledge")
SOURCES = ("MMMU", "MathVista", "ScienceQA")


def _image(record: Mapping[str, Any], data_dir: Path, cache: Path | None) -> tuple[Path | None, str | None]:
    """(path of the record's image, problem detail or None)."""
    image = record.get("image")
    if isinstance(image, Mapping):
        data, name = image.get("bytes"), as_text(image.get("path"))
        if data:
            assert cache is not None
            return write_cached(cache, f"mmevalpro-{record['index']}", bytes(data), name), None
        if name:
            return data_dir / name, None
    elif isinstance(image, str) and image:
        return data_dir / image, None
    return None, "the record has no image"


def _choices(value: Any) -> list[str] | None:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [as_text(c) for c in value]
    return None


def read(data_dir: Path, source: str = "", eval_type: str = "", instruction: str = "") -> Release:
    data_dir = Path(data_dir)
    release = Release("mmevalpro")
    files = parquet_files(data_dir)
    if not files:
        return missing_release_file(release, data_dir / "data" / "*.parquet", "MMEvalPro Parquet files")
    cache = cache_dir(data_dir)
    seen: set[str] = set()
    for path, n, record in read_parquet_rows(files):
        src, kind = as_text(record.get("source")).strip(), as_text(record.get("eval_type")).strip()
        if source and src.lower() != source.lower() or eval_type and kind.lower() != eval_type.lower():
            continue
        release.count(src or "?")
        where = f"{path.name} row {n} (index {record.get('index')}, triplet {record.get('triplet_id')})"
        choices = _choices(record.get("choices"))
        question = as_text(record.get("question")).strip()
        if record.get("index") is None or record.get("triplet_id") is None or not question or choices is None:
            release.problem(UNREADABLE_RECORD, where, "needs index, triplet_id, question and a list of choices")
            continue
        answer = as_text(record.get("answer"))
        unknown = []
        if kind not in EVAL_TYPES:
            unknown.append(f"eval_type {kind!r} is not one of {', '.join(EVAL_TYPES)}")
        if src not in SOURCES:
            unknown.append(f"source {src!r} is not one of {', '.join(SOURCES)}")
        if not answer.strip():
            unknown.append("no choices and an empty answer")
        if unknown:
            release.problem(UNKNOWN_VALUE, where, "; ".join(unknown))
            continue
        item_id = f"mmevalpro-{record['index']}"
        if item_id in seen:
            release.problem(DUPLICATE_RECORD, where, f"index {record['index']} occurs twice")
            continue
        seen.add(item_id)
        matchable = not choices or answer in LETTERS[: len(choices)]
        if not matchable:
            release.note(UNMATCHABLE_ANSWER, where, f"answer {answer!r} is not the letter of one of its "
                         f"{len(choices)} choices: the official scorer compares it with the chosen letter, so it "
                         f"counts as wrong whatever the reply")  # fmt: skip
        image, missing = _image(record, data_dir, cache)
        if image is None:
            release.problem(MISSING_IMAGE, where, missing or "no image")
            continue
        if found := image_problem(image):
            release.problem(found[0], where, found[1], image)
            continue
        prompt = f"{question} Options: {format_options(choices)}" if choices else question
        release.items.append(
            Item(
                id=item_id,
                question=question,
                prompt=f"{prompt} {instruction}".strip(),
                answer=answer,
                image=image,
                options=tuple(choices),
                extra={
                    "index": record["index"],
                    "triplet_id": record["triplet_id"],
                    "eval_type": kind,
                    "source": src,
                    "question_category": as_text(record.get("question_category")),
                    "matchable": matchable,
                },
            )
        )
    return release


load = strict(read)


def model_output(item: Item, prediction: Prediction) -> str | None:
    """What the official scorer would compare with `answer`: the chosen letter, or (no choices) the
    final answer text; None when the reply gives none."""
    if isinstance(prediction, Mapping) and prediction.get("model_output") is not None:
        return as_text(prediction["model_output"])
    text = reply_text(prediction)
    if item.options:
        return extract_choice(text, item.options)
    span = final_answer_span(text)
    return span.strip() if span is not None else None


def correct(item: Item, prediction: Prediction) -> bool:
    return model_output(item, prediction) == item.answer


def _cal_score(rows: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """auto_score.py's `cal_score` on rows {triplet_id, eval_type, answer, model_output}: percentages,
    rounded to 2 places; None for no rows (the official script would divide by zero)."""
    if not rows:
        return None
    triplets: dict[Any, list[bool]] = defaultdict(list)
    for row in rows:
        triplets[row["triplet_id"]].append(row["answer"] == row["model_output"])

    def share(kind: str | None) -> float | None:
        chosen = [r["answer"] == r["model_output"] for r in rows if kind is None or r["eval_type"] == kind]
        return round(100 * sum(chosen) / len(chosen), 2) if chosen else None

    return {
        "genuine_accuracy_score": round(100 * sum(all(v) for v in triplets.values()) / len(triplets), 2),
        "average_score": share(None),
        "origin_score": share("Origin"),
        "perception_score": share("Perception"),
        "knowledge_score": share("Knowledge"),
    }


_FIGURES = ("genuine_accuracy_score", "average_score", "origin_score", "perception_score", "knowledge_score")


def macro_average(per_source: Mapping[str, Mapping[str, float | None] | None]) -> dict[str, float] | None:
    """The official Macro_Average: the mean of the three sources' rounded figures, rounded to 2 places;
    None unless all three sources have every figure."""
    present = [per_source.get(s) for s in SOURCES]
    if any(p is None or any(p.get(k) is None for k in _FIGURES) for p in present):
        return None
    return {k: round(sum(p[k] for p in present) / len(present), 2) for k in _FIGURES}  # type: ignore[index,misc]


def auto_score(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The official score file: per source, Macro_Average, Micro_Average (all rows)."""
    out: dict[str, Any] = {s: _cal_score([r for r in rows if r["source"] == s]) for s in SOURCES}
    out["Macro_Average"] = macro_average(out)
    out["Micro_Average"] = _cal_score(rows)
    return out


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    rows = []
    unparsed = missing = 0
    for item in items:
        prediction = predictions.get(item.id)
        output = model_output(item, prediction)
        missing += prediction is None or (isinstance(prediction, Mapping) and bool(prediction.get("error")))
        unparsed += output is None
        rows.append({**item.extra, "answer": item.answer, "model_output": output})
    return {
        **auto_score(rows),
        "questions": len(items),
        "unparsed": unparsed,
        "missing": missing,
        "unmatchable_answers": sum(not i.extra.get("matchable", True) for i in items),
    }


def official_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The rows of the official output format, or None when `records` are not in it."""
    needed = ("triplet_id", "model_output", "answer", "source", "eval_type")
    if not records or not all(isinstance(r, Mapping) and all(k in r for k in needed) for r in records):
        return None
    return [dict(r) for r in records]


def score_official(records: Sequence[Mapping[str, Any]], items: Sequence[Item]) -> dict[str, Any] | None:
    """`bench score` on the official output format: auto_score.py's figures from the rows as they are,
    plus how many rows the release does not know or disagrees with (by `index`)."""
    rows = official_rows(records)
    if rows is None:
        return None
    by_index = {str(i.extra["index"]): i for i in items}
    unknown = disagree = 0
    for row in rows:
        item = by_index.get(as_text(row.get("index")))
        if item is None:
            unknown += 1
        elif (item.answer, str(item.extra["triplet_id"]), item.extra["eval_type"], item.extra["source"]) != (
            as_text(row["answer"]),
            as_text(row["triplet_id"]),
            row["eval_type"],
            row["source"],
        ):
            disagree += 1
    return {**auto_score(rows), "rows": len(rows), "rows_not_in_release": unknown, "rows_disagreeing": disagree}
