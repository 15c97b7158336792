"""HallusionBench (Guan et al., CVPR 2024): 1,129 yes/no questions about 346 figures, many of them edited.

Layout: the benchmark's repository (tianyi-lab/HallusionBench) with its image archive unzipped inside::

    DATA_DIR/HallusionBench.json     list of records: category ("VD" | "VS"), subcategory, visual_input
                                     ("0" no figure, "1" original, "2" edited), set_id, figure_id,
                                     sample_note, question_id, question, gt_answer_details, gt_answer
                                     ("1" yes, "0" no), filename (null without a figure)
    DATA_DIR/hallusion_bench/VD/...  hallusion_bench.zip, unzipped (README, step 2)
    DATA_DIR/hallusion_bench/VS/...

Both spellings of `filename` in the wild are read: the current `./VD/video/19_2.png` (relative to
`hallusion_bench/`) and the 2023 `./hallusion_bench/VD/illusion/0_0.png` (relative to DATA_DIR).

Scoring follows the official `utils.py` (the version released with the current HallusionBench.json):

- each reply is read as 1 (agrees with the answer), 0 (contradicts it) or 2 (uncertain: it says neither
  yes nor no). The official script asks GPT-4 for this; we read the yes/no in the reply
  (`mcq.extract_yes_no`), and a prediction carrying the judge's code (`bench score` on the official
  result file) is scored by that code;
- a question counts as right when its code is 1, and, for a VS question asked without its figure
  (figure_id 0), when it is 1 or 2: not knowing is not a hallucination there;
- `aAcc` (Acc per question): share of questions right; `qAcc` (Acc per question pair): share of
  question groups (category, subcategory, set_id, question_id) with every member right; `fAcc` (Acc per
  figure): share of figures (category, subcategory, set_id, figure_id; VS without figure excluded) with
  every question right, and `figure_score` the mean share right per figure; `easy_acc` and `hard_acc`:
  the question-group accuracy over the questions of figure_id 0 (the original figure, or no figure for
  VS) and over the others. (That utils.py splits by figure_id; a split by visual_input {0, 1} vs 2
  survives there only as a commented-out line. The two differ for VS figures with visual_input 1, e.g.
  VS/chart/5/1: hard by figure_id, as the README's definition "VS hard: with visual input" says.)
  The same figures per category under `by_category`. Fractions (0-1); the official tables print
  them ×100;
- a failed or missing prediction is wrong (code 0) and counted in `missing`, never read as "uncertain".

Loader options: `instruction` (text appended to every question after a space; default none).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text
from faithproxy.benchmarks.evaluation.datasets.release import (
    DUPLICATE_RECORD,
    UNKNOWN_VALUE,
    UNREADABLE_RECORD,
    Release,
    as_text,
    image_problem,
    missing_release_file,
    strict,
    verdict_of,
)
from faithproxy.benchmarks.evaluation.mcq import extract_yes_no

OFFICIAL = ("qAcc", "fAcc", "easy_acc", "hard_acc", "aAcc")
CATEGORIES = ("VD", "VS")
VISUAL_INPUTS = ("0", "1", "2")
_GOLD = {"1": "yes", "0": "no"}
_KEY_FIELDS = ("category", "subcategory", "set_id", "figure_id", "question_id")
IMAGES = "hallusion_bench"  # the folder hallusion_bench.zip unpacks to


def image_path(data_dir: Path, filename: str) -> Path:
    """Where a record's figure is: both `filename` spellings, the layout after unzipping first."""
    relative = filename.strip().removeprefix("./")
    candidates = [data_dir / relative] if relative.startswith(f"{IMAGES}/") else [data_dir / IMAGES / relative]
    candidates.append(data_dir / relative)
    return next((p for p in candidates if p.exists()), candidates[0])


def record_key(record: Mapping[str, Any]) -> tuple[str, ...]:
    """The official per-question key (category, subcategory, set_id, figure_id, question_id)."""
    return tuple(as_text(record.get(k)).strip() for k in _KEY_FIELDS)


def item_id(key: Sequence[str]) -> str:
    return "hb-" + "-".join(key)


def read(data_dir: Path, instruction: str = "") -> Release:
    data_dir = Path(data_dir)
    release = Release("hallusionbench")
    path = data_dir / "HallusionBench.json"
    if not path.exists():
        return missing_release_file(release, path, "HallusionBench.json")
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        release.problem(UNREADABLE_RECORD, "HallusionBench.json", f"not JSON ({exc})", path)
        return release
    seen: set[str] = set()
    for n, record in enumerate(records if isinstance(records, list) else []):
        if not isinstance(record, dict):
            release.count("?")
            release.problem(UNREADABLE_RECORD, f"HallusionBench.json #{n}", "not a JSON object")
            continue
        key = record_key(record)
        category, visual = key[0], as_text(record.get("visual_input")).strip()
        release.count(category or "?")
        where = f"HallusionBench.json #{n} ({'/'.join(key)})"
        if not all(key) or not as_text(record.get("question")).strip():
            release.problem(UNREADABLE_RECORD, where, "a key field or the question is empty")
            continue
        gold = _GOLD.get(as_text(record.get("gt_answer")).strip())
        unknown = [
            f"{name} {value!r}"
            for name, value, known in (
                ("category", category, CATEGORIES),
                ("visual_input", visual, VISUAL_INPUTS),
                ("gt_answer", as_text(record.get("gt_answer")), tuple(_GOLD)),
            )
            if value.strip() not in known
        ]
        if unknown or gold is None:
            release.problem(UNKNOWN_VALUE, where, "; ".join(unknown) or "gt_answer")
            continue
        if item_id(key) in seen:
            release.problem(DUPLICATE_RECORD, where, "the official key occurs twice (the official scorer asserts it)")
            continue
        seen.add(item_id(key))
        image = None
        filename = as_text(record.get("filename")).strip()
        if visual != "0":
            if not filename:
                release.problem(UNREADABLE_RECORD, where, f"visual_input {visual} but no filename")
                continue
            image = image_path(data_dir, filename)
            if found := image_problem(image):
                release.problem(found[0], where, found[1], image)
                continue
        question = as_text(record["question"]).strip()
        release.items.append(
            Item(
                id=item_id(key),
                question=question,
                prompt=f"{question} {instruction}".strip(),
                answer=gold,
                image=image,
                extra={
                    "category": category,
                    "subcategory": key[1],
                    "set_id": key[2],
                    "figure_id": key[3],
                    "question_id": key[4],
                    "visual_input": visual,
                },
            )
        )
    return release


load = strict(read)


def code_of(item: Item, prediction: Prediction) -> int | None:
    """The official correctness code: 1 right, 0 wrong, 2 uncertain; None for a missing or failed
    prediction. A judge's code carried by the prediction wins."""
    verdict = verdict_of(prediction)
    if verdict is not None:
        return int(verdict)
    text = reply_text(prediction)
    if text is None:
        return None
    said = extract_yes_no(text)
    return 2 if said is None else int(said == item.answer)


def _counts_right(item: Item, code: int | None) -> bool:
    if item.extra["category"] == "VS" and item.extra["figure_id"] == "0":
        return code in (1, 2)
    return code == 1


def correct(item: Item, prediction: Prediction) -> bool:
    return _counts_right(item, code_of(item, prediction))


def _all_right(groups: Mapping[Any, list[bool]]) -> float | None:
    return ratio(sum(all(v) for v in groups.values()), len(groups))


def _figures(rows: Sequence[tuple[Item, bool]]) -> dict[str, Any]:
    questions: dict[tuple, list[bool]] = defaultdict(list)
    easy: dict[tuple, list[bool]] = defaultdict(list)
    hard: dict[tuple, list[bool]] = defaultdict(list)
    figures: dict[tuple, list[bool]] = defaultdict(list)
    for item, right in rows:
        e = item.extra
        group = (e["category"], e["subcategory"], e["set_id"], e["question_id"])
        questions[group].append(right)
        (easy if e["figure_id"] == "0" else hard)[group].append(right)
        if not (e["category"] == "VS" and e["figure_id"] == "0"):
            figures[(e["category"], e["subcategory"], e["set_id"], e["figure_id"])].append(right)
    return {
        "questions": len(rows),
        "aAcc": ratio(sum(r for _, r in rows), len(rows)),
        "qAcc": _all_right(questions),
        "fAcc": _all_right(figures),
        "figure_score": ratio(sum(sum(v) / len(v) for v in figures.values()), len(figures)),
        "easy_acc": _all_right(easy),
        "hard_acc": _all_right(hard),
        "question_pairs": len(questions),
        "figures": len(figures),
        "easy_pairs": len(easy),
        "hard_pairs": len(hard),
    }


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    rows: list[tuple[Item, bool]] = []
    uncertain = missing = 0
    for item in items:
        code = code_of(item, predictions.get(item.id))
        missing += code is None
        uncertain += code == 2
        rows.append((item, _counts_right(item, code)))
    return {
        **_figures(rows),
        "by_category": {c: _figures([r for r in rows if r[0].extra["category"] == c]) for c in CATEGORIES},
        "uncertain": uncertain,
        "missing": missing,
    }


def from_official(records: Sequence[Mapping[str, Any]], items: Sequence[Item]) -> dict[str, Prediction] | None:
    """Predictions from the official result file (HallusionBench.json's records with `model_prediction`;
    a `*_gpt_check` field, when present, is the judge's code 0/1/2 and decides)."""
    if not records or not all(isinstance(r, Mapping) and "model_prediction" in r for r in records):
        return None
    out: dict[str, Prediction] = {}
    for record in records:
        prediction: dict[str, Any] = {"id": item_id(record_key(record)), "text": as_text(record["model_prediction"])}
        checks = [k for k in record if k.endswith("_gpt_check") or k.endswith("_human_check")]
        if checks and as_text(record[checks[0]]).strip() in ("0", "1", "2"):
            prediction["verdict"] = int(as_text(record[checks[0]]).strip())
        out[prediction["id"]] = prediction
    return out
