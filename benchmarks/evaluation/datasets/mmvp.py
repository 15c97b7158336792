"""MMVP (Tong et al., "Eyes Wide Shut?"): 300 two-option questions in 150 pairs of CLIP-blind images.

Layout (the release on the Hugging Face hub, copied to a local directory)::

    DATA_DIR/Questions.csv        columns: Index, Question, Options, Correct Answer
                                  (the release spells the first header "lndex"; either is read)
    DATA_DIR/MMVP Images/<Index>.jpg

`Options` reads like `(a) Open (b) Closed`, `Correct Answer` like `(a)`. Questions 1 and 2 form the
first pair, 3 and 4 the second, and so on.

Metrics: `pair_accuracy` is the benchmark's own figure (the official grader, `scripts/gpt_grader.py`,
reads the answers two by two and reports only the share of pairs with both right); `accuracy` per
question is ours, for diagnosis, and is not comparable with published MMVP numbers. Pairs with a
question missing from the run are left out and counted in `incomplete_pairs`. Unparseable replies are
wrong and counted in `unparsed`. The official grader asks GPT-4 whether each reply is right; we read the
chosen letter instead (`mcq.extract_choice`). A prediction carrying that judge's verdict
(`bench score` on the official `answer.jsonl` with a `gpt_grade` field) is scored by the verdict.

`bench score` takes our `predictions.jsonl` or the official answer file (JSON lines with `question_id`,
`prompt`, `answer`, `response`, optionally `gpt_grade`: "yes" | "no").

Loader options: `instruction` (text appended to every prompt after a space; default none).
"""

from __future__ import annotations

import csv
import re
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
    image_problem,
    missing_release_file,
    strict,
    verdict_of,
)
from faithproxy.benchmarks.evaluation.mcq import LETTERS, extract_choice, format_options

OFFICIAL = ("pair_accuracy",)  # the figures the benchmark's own grader reports

_OPTION = re.compile(r"\(([a-z])\)\s*", re.I)


def parse_options(text: str) -> list[str]:
    """`(a) Open (b) Closed` → ["Open", "Closed"]."""
    pieces = _OPTION.split(text.strip())
    # split gives ["", "a", "Open ", "b", "Closed"]
    return [pieces[i + 1].strip() for i in range(1, len(pieces) - 1, 2)]


def _gold_letter(text: str) -> str | None:
    match = re.fullmatch(r"\s*\(?\s*([a-z])\s*\)?\s*", text, re.I)
    return match.group(1).upper() if match else None


def _image(data_dir: Path, index: str) -> Path:
    folder = data_dir / "MMVP Images"
    for suffix in (".jpg", ".jpeg", ".png"):
        if (path := folder / f"{index}{suffix}").exists():
            return path
    return folder / f"{index}.jpg"


def read(data_dir: Path, instruction: str = "") -> Release:
    data_dir = Path(data_dir)
    release = Release("mmvp")
    questions = data_dir / "Questions.csv"
    if not questions.exists():
        return missing_release_file(release, questions, "Questions.csv")
    seen: set[str] = set()
    with questions.open(newline="", encoding="utf-8-sig") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            release.count("test")
            index = (row.get("Index") or row.get("lndex") or "").strip()
            where = f"Questions.csv line {line} (Index {index or '?'})"
            question = (row.get("Question") or "").strip()
            options = parse_options(row.get("Options") or "")
            if not index.isdigit() or not question or len(options) < 2:
                release.problem(UNREADABLE_RECORD, where, "needs a numeric Index, a Question and '(a) x (b) y' Options")
                continue
            gold = _gold_letter(row.get("Correct Answer") or "")
            if gold is None or gold not in LETTERS[: len(options)]:
                release.problem(UNKNOWN_VALUE, where, f"Correct Answer {row.get('Correct Answer')!r} is not one of "
                                f"the {len(options)} options")  # fmt: skip
                continue
            if index in seen:
                release.problem(DUPLICATE_RECORD, where, f"Index {index} occurs twice")
                continue
            seen.add(index)
            image = _image(data_dir, index)
            if found := image_problem(image):
                release.problem(found[0], where, found[1], image)
                continue
            prompt = f"{question} Options: {format_options(options)}"
            release.items.append(
                Item(
                    id=f"mmvp-{index}",
                    question=question,
                    prompt=f"{prompt} {instruction}".strip(),
                    answer=gold,
                    image=image,
                    options=tuple(options),
                    extra={"pair": (int(index) - 1) // 2},
                )
            )
    return release


load = strict(read)


def _right(item: Item, prediction: Prediction) -> tuple[bool, bool]:
    """(right, parsed): an official judge's verdict when the prediction carries one, else the letter."""
    verdict = verdict_of(prediction)
    if verdict is not None:
        return bool(verdict), True
    choice = extract_choice(reply_text(prediction), item.options)
    return choice == item.answer and item.answer in LETTERS, choice is not None


def correct(item: Item, prediction: Prediction) -> bool:
    return _right(item, prediction)[0]


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    right: dict[str, bool] = {}
    unparsed = 0
    for item in items:
        right[item.id], parsed = _right(item, predictions.get(item.id))
        unparsed += not parsed
    pairs: dict[int, list[bool]] = defaultdict(list)
    for item in items:
        pairs[item.extra["pair"]].append(right[item.id])
    complete = [v for v in pairs.values() if len(v) == 2]
    return {
        "questions": len(items),
        "accuracy": ratio(sum(right.values()), len(items)),
        "pairs": len(complete),
        "pair_accuracy": ratio(sum(all(v) for v in complete), len(complete)),
        "incomplete_pairs": len(pairs) - len(complete),
        "unparsed": unparsed,
    }


def from_official(records: Sequence[Mapping[str, Any]], items: Sequence[Item]) -> dict[str, Prediction] | None:
    """Predictions from the official answer file (`scripts/evaluate_mllm.py` writes `question_id` = the
    row's Index, `response`; `gpt_grader.py`'s yes/no, when kept as `gpt_grade`, is the verdict)."""
    if not records or not all("question_id" in r and "response" in r for r in records):
        return None
    out: dict[str, Prediction] = {}
    for record in records:
        prediction: dict[str, Any] = {"id": f"mmvp-{record['question_id']}", "text": str(record["response"])}
        if record.get("gpt_grade") is not None:
            prediction["verdict"] = str(record["gpt_grade"]).strip().lower() == "yes"
        out[prediction["id"]] = prediction
    return out
