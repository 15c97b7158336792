"""MMVP (Tong et al., "Eyes Wide Shut?"): 300 two-option questions in 150 pairs of CLIP-blind images.

Layout (the release on the Hugging Face hub, copied to a local directory)::

    DATA_DIR/Questions.csv        columns: Index, Question, Options, Correct Answer
                                  (the release spells the first header "lndex"; either is read)
    DATA_DIR/MMVP Images/<Index>.jpg

`Options` reads like `(a) Open (b) Closed`, `Correct Answer` like `(a)`. Questions 1 and 2 form the
first pair, 3 and 4 the second, and so on.

Metrics: `accuracy` per question, `pair_accuracy` (a pair counts only when both of its questions are
right; pairs with a question missing from the run are left out and counted in `incomplete_pairs`).
Unparseable replies are wrong and counted in `unparsed`.

Loader options: `instruction` (text appended to every prompt after a space; default none).
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text, require_file
from faithproxy.benchmarks.evaluation.mcq import LETTERS, extract_choice, format_options

_OPTION = re.compile(r"\(([a-z])\)\s*", re.I)


def parse_options(text: str) -> list[str]:
    """`(a) Open (b) Closed` → ["Open", "Closed"]."""
    pieces = _OPTION.split(text.strip())
    # split gives ["", "a", "Open ", "b", "Closed"]
    return [pieces[i + 1].strip() for i in range(1, len(pieces) - 1, 2)]


def _gold_letter(text: str) -> str:
    match = re.search(r"[a-z]", text, re.I)
    if match is None:
        raise ValueError(f"unreadable Correct Answer {text!r}")
    return match.group(0).upper()


def _image(data_dir: Path, index: str) -> Path:
    folder = data_dir / "MMVP Images"
    for suffix in (".jpg", ".jpeg", ".png"):
        if (path := folder / f"{index}{suffix}").exists():
            return path
    return folder / f"{index}.jpg"


def load(data_dir: Path, instruction: str = "") -> list[Item]:
    data_dir = Path(data_dir)
    items = []
    with require_file(data_dir / "Questions.csv", "MMVP questions").open(newline="", encoding="utf-8-sig") as f:
        for row in csv.DictReader(f):
            index = (row.get("Index") or row.get("lndex") or "").strip()
            options = parse_options(row["Options"])
            prompt = f"{row['Question'].strip()} Options: {format_options(options)}"
            items.append(
                Item(
                    id=f"mmvp-{index}",
                    question=row["Question"].strip(),
                    prompt=f"{prompt} {instruction}".strip(),
                    answer=_gold_letter(row["Correct Answer"]),
                    image=_image(data_dir, index),
                    options=tuple(options),
                    extra={"pair": (int(index) - 1) // 2},
                )
            )
    return items


def correct(item: Item, prediction: Prediction) -> bool:
    return extract_choice(reply_text(prediction), item.options) == item.answer


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    right: dict[str, bool] = {}
    unparsed = 0
    for item in items:
        choice = extract_choice(reply_text(predictions.get(item.id)), item.options)
        unparsed += choice is None
        right[item.id] = choice == item.answer and item.answer in LETTERS
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
