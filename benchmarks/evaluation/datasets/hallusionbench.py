"""HallusionBench (Guan et al., CVPR 2024): 1,129 yes/no questions about 346 figures, many edited.

Layout (the release of the benchmark's repository)::

    DATA_DIR/HallusionBench.json   a list of records: category ("VD" | "VS"), subcategory, visual_input
                                   ("0" no image, "1" the original figure, "2" an edited figure), set_id,
                                   figure_id, question_id, question, gt_answer ("1" yes, "0" no),
                                   gt_answer_details, filename ("./hallusion_bench/VD/ocr/0_0.png", null
                                   without an image)
    DATA_DIR/hallusion_bench/...   the images the filenames point to

Metrics (the benchmark's own definitions):

- `aAcc`: share of questions answered right;
- `qAcc`: share of question groups (category, subcategory, set_id, question_id: one question asked of
  the original and the edited figures, and without a figure) with every member right;
- `fAcc`: share of figures (category, subcategory, set_id, figure_id, questions with an image) whose
  questions are all right;
- `easy_aAcc` (original figures, visual_input 1), `hard_aAcc` (edited figures, visual_input 2),
  `no_visual_aAcc` (visual_input 0).

A reply that says neither yes nor no is wrong and counted in `unparsed`.
Loader options: `instruction` (text appended to every question after a space; default none).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text, require_file
from faithproxy.benchmarks.evaluation.mcq import extract_yes_no

_GOLD = {"1": "yes", "0": "no"}
SPLITS = {"0": "no_visual", "1": "easy", "2": "hard"}


def load(data_dir: Path, instruction: str = "") -> list[Item]:
    data_dir = Path(data_dir)
    records = json.loads(require_file(data_dir / "HallusionBench.json", "HallusionBench questions").read_text())
    items = []
    ids: set[str] = set()
    for record in records:
        gold = _GOLD.get(str(record["gt_answer"]).strip())
        if gold is None:
            raise ValueError(f"HallusionBench: gt_answer {record['gt_answer']!r} is neither '0' nor '1'")
        key = [str(record[k]) for k in ("category", "subcategory", "set_id")]
        visual = str(record["visual_input"])
        filename = record.get("filename")
        image = data_dir / filename.removeprefix("./") if filename and visual != "0" else None
        question = record["question"].strip()
        item_id = base = "hb-" + "-".join([*key, str(record["figure_id"]), str(record["question_id"]), visual])
        for n in range(2, len(records) + 2):  # should a key repeat, keep both records apart
            if item_id not in ids:
                break
            item_id = f"{base}-{n}"
        ids.add(item_id)
        items.append(
            Item(
                id=item_id,
                question=question,
                prompt=f"{question} {instruction}".strip(),
                answer=gold,
                image=image,
                extra={
                    "split": SPLITS.get(visual, visual),
                    "question_group": "/".join([*key, str(record["question_id"])]),
                    "figure": "/".join([*key, str(record["figure_id"])]) if image is not None else None,
                },
            )
        )
    return items


def _all_right(groups: Mapping[str, list[bool]]) -> float | None:
    return ratio(sum(all(v) for v in groups.values()), len(groups))


def correct(item: Item, prediction: Prediction) -> bool:
    return extract_yes_no(reply_text(prediction)) == item.answer


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    questions: dict[str, list[bool]] = defaultdict(list)
    figures: dict[str, list[bool]] = defaultdict(list)
    splits: dict[str, list[bool]] = {name: [] for name in SPLITS.values()}
    unparsed = 0
    for item in items:
        said = extract_yes_no(reply_text(predictions.get(item.id)))
        unparsed += said is None
        right = said == item.answer
        questions[item.extra["question_group"]].append(right)
        if item.extra["figure"] is not None:
            figures[item.extra["figure"]].append(right)
        splits.setdefault(item.extra["split"], []).append(right)
    n_right = sum(sum(v) for v in splits.values())
    return {
        "questions": len(items),
        "aAcc": ratio(n_right, len(items)),
        "qAcc": _all_right(questions),
        "fAcc": _all_right(figures),
        **{f"{name}_aAcc": ratio(sum(v), len(v)) for name, v in splits.items()},
        **{f"{name}_questions": len(v) for name, v in splits.items()},
        "question_groups": len(questions),
        "figures": len(figures),
        "unparsed": unparsed,
    }
