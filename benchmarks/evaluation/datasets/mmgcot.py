"""MM-GCoT (Wu et al., "Grounded Chain-of-Thought for Multimodal Large Language Models"): does the answer
rest on the right part of the image?

Layout: the benchmark's repository (DoubtedSteam/MM-GCoT) and the Visual Genome images it points to::

    DATA_DIR/dataset/GCoT_dataset_attributes_test.json   (or DATA_DIR/GCoT_dataset_*_test.json)
    DATA_DIR/dataset/GCoT_dataset_judge_test.json
    DATA_DIR/dataset/GCoT_dataset_objects_test.json
    IMAGES/vg/VG_100K/2361224.jpg, IMAGES/vg/VG_100K_2/...   (loader option `images`, default DATA_DIR)

Records: `id` (repeats within a split: it is not a key), `img` (relative to IMAGES), `question`, `cot`
(reference grounded steps), `answer`, `coordinate` (a string, "[x, y, w, h]" normalised to the image
size), `qualified`. Items are named `mmgcot-<split>-<id>`, with `-2`, `-3` ... for repeats in file order.

Scoring follows the official `eval.py`, per split:

- answer right: the reply's answer with periods removed and lower-cased equals the gold answer
  lower-cased (the official script compares the whole answer turn; we ask for one reply and read its
  "Answer: ..." line, `extract_answer`);
- box: the first `[numbers]` of the reply (`parse_bbox`, as official: unreadable is [0, 0, 0, 0]),
  converted to normalised x, y, w, h by the model's convention (loader option `box_format`): `qwen`
  (pixels x1y1x2y2 divided by the original image size: the official `--qwen`), `internvl` (0-1000
  x1y1x2y2: `--internvl`), `raw` (taken as x, y, w, h already: the official default);
- hit: IoU with the gold box > 0.5; `answer_accuracy`, `grounding_accuracy` (the official "REC
  Acc@0.5"), `consistency` = CR / (CR + CM + WR) with CR right & hit, CM right & miss, WR wrong & hit.
  Fractions (0-1); the official script prints them ×100. `by_split` holds each split's figures (the
  official unit); the top level pools the splits read.

The official harness asks in two turns (answer, then box, or the reverse); `bench run` sends one request
asking for both in the same order (loader option `setting`: `answer_first` or `grounding_first`).
`bench score` also takes the official result file (JSON lines `question_id`, `img`, `text`, `coor`,
`gt_text`, `gt_coor`), read in file order against the split given by `--loader-arg split=...`.

Loader options: `split` (`attributes`, `judge`, `objects` or `all`, default), `images`, `setting`,
`box_format`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text
from faithproxy.benchmarks.evaluation.datasets.release import (
    UNREADABLE_RECORD,
    Release,
    as_text,
    first_existing,
    image_problem,
    image_size,
    missing_release_file,
    read_json_records,
    strict,
    unique_id,
)
from faithproxy.benchmarks.evaluation.mcq import split_reasoning

OFFICIAL = ("answer_accuracy", "grounding_accuracy", "consistency")
SPLITS = ("attributes", "judge", "objects")
BOX_FORMATS = ("qwen", "internvl", "raw")
SETTINGS = {
    "answer_first": (
        'Answer the question using a single word or phrase, on a line starting with "Answer:". Then outline '
        "the position of the final answer and output the coordinate in JSON format."
    ),
    "grounding_first": (
        "Outline the position of the final answer and output the coordinate in JSON format. Then answer the "
        'question using a single word or phrase, on a line starting with "Answer:".'
    ),
}

Box = tuple[float, float, float, float]
_BRACKET = re.compile(r"\[([0-9., ]+)\]")
_ANSWER = re.compile(r"(?:final\s+)?answer\s*(?:is|:)\s*(?=(?P<span>[^\n]*))", re.I)
_JSON_OR_BOX = re.compile(r"```.*?```|\[[^\]]*\]|\{[^}]*\}", re.S)


def parse_bbox(text: str | None) -> list[float]:
    """The official `parse_bbox`: the first bracket of digits, dots, commas and spaces, as floats; a
    text without one is read whole, minus its first and last character; [0, 0, 0, 0] when that fails
    or gives fewer than four numbers."""
    if text is None:
        return [0.0, 0.0, 0.0, 0.0]
    match = _BRACKET.search(text)
    body = match.group(0) if match else text
    try:
        values = [float(x) for x in body[1:-1].split(",")]
    except ValueError:
        return [0.0, 0.0, 0.0, 0.0]
    return values if len(values) >= 4 else [0.0, 0.0, 0.0, 0.0]


def iou_xywh(a: Sequence[float], b: Sequence[float]) -> float:
    """The official `calculate_iou` on x, y, w, h boxes; 0 when the union is 0."""
    x1, y1, w1, h1 = a[:4]
    x2, y2, w2, h2 = b[:4]
    inter = max(0.0, min(x1 + w1, x2 + w2) - max(x1, x2)) * max(0.0, min(y1 + h1, y2 + h2) - max(y1, y2))
    union = w1 * h1 + w2 * h2 - inter
    return inter / union if union != 0 else 0.0


def to_xywh(box: Sequence[float], box_format: str, width: int | None = None, height: int | None = None) -> Box:
    """A parsed box in the model's convention → normalised x, y, w, h (the official conversions)."""
    a, b, c, d = box[:4]
    if box_format == "qwen":
        if not width or not height:
            raise ValueError("box_format qwen needs the image size")
        return a / width, b / height, (c - a) / width, (d - b) / height
    if box_format == "internvl":
        return a / 1000, b / 1000, (c - a) / 1000, (d - b) / 1000
    return a, b, c, d


def split_files(data_dir: Path, split: str) -> list[tuple[str, Path]]:
    names = SPLITS if split == "all" else (split,)
    out = []
    for name in names:
        file = f"GCoT_dataset_{name}_test.json"
        found = first_existing([data_dir / "dataset" / file, data_dir / file])
        out.append((name, found or data_dir / "dataset" / file))
    return out


def read(
    data_dir: Path, split: str = "all", images: str = "", setting: str = "answer_first", box_format: str = "qwen"
) -> Release:
    if split not in (*SPLITS, "all"):
        raise ValueError(f"MM-GCoT: split must be one of {', '.join(SPLITS)} or all, not {split!r}")
    if setting not in SETTINGS:
        raise ValueError(f"MM-GCoT: setting must be one of {', '.join(SETTINGS)}, not {setting!r}")
    if box_format not in BOX_FORMATS:
        raise ValueError(f"MM-GCoT: box_format must be one of {', '.join(BOX_FORMATS)}, not {box_format!r}")
    data_dir = Path(data_dir)
    given = Path(images).expanduser()
    image_root = given if images and given.is_absolute() else data_dir / images
    release = Release("mmgcot")
    for name, path in split_files(data_dir, split):
        if not path.exists():
            missing_release_file(release, path, path.name)
            continue
        seen: set[str] = set()
        occurrences: Counter[str] = Counter()
        for n, record in enumerate(read_json_records(path)):
            release.count(name)
            rid = as_text(record.get("id") if isinstance(record, dict) else None).strip()
            where = f"{path.name} #{n} (id {rid or '?'})"
            if not isinstance(record, dict) or not rid or not as_text(record.get("img")).strip():
                release.problem(UNREADABLE_RECORD, where, "needs id and img")
                continue
            question, answer = as_text(record.get("question")).strip(), as_text(record.get("answer"))
            gold = parse_bbox(as_text(record.get("coordinate")))
            if not question or not answer.strip() or gold[2] <= 0 or gold[3] <= 0:
                release.problem(UNREADABLE_RECORD, where, f"needs a question, an answer and a box; coordinate "
                                f"{record.get('coordinate')!r}")  # fmt: skip
                continue
            image = image_root / as_text(record["img"]).strip()
            if found := image_problem(image):
                release.problem(found[0], where, found[1], image)
                continue
            width, height = image_size(image)
            occurrences[rid] += 1
            release.items.append(
                Item(
                    id=unique_id(f"mmgcot-{name}-{rid}", seen),
                    question=question,
                    prompt=f"{question}\n{SETTINGS[setting]}",
                    answer=answer,
                    image=image,
                    extra={
                        "split": name,
                        "record_id": rid,
                        "occurrence": occurrences[rid],
                        "box": tuple(gold[:4]),
                        "width": width,
                        "height": height,
                        "setting": setting,
                        "box_format": box_format,
                    },
                )
            )
    return release


load = strict(read)


def extract_answer(text: str) -> str | None:
    """The short answer of a one-turn reply: the last "Answer: ..." span, else the last line that is not
    a box or JSON; boxes and JSON removed. Only the part after `</think>` counts when there is one."""
    answer, _ = split_reasoning(text)
    spans = [m["span"] for m in _ANSWER.finditer(answer)]
    if spans:
        candidate = spans[-1]
    else:
        lines = [line for line in _JSON_OR_BOX.sub("", answer).splitlines() if line.strip()]
        candidate = lines[-1] if lines else ""
    candidate = _JSON_OR_BOX.sub("", candidate).strip().strip("*`\"' ")
    return candidate or None


def answer_right(answer: str | None, gold: str) -> bool:
    """The official comparison: periods removed and lower-cased, equal to the gold lower-cased."""
    return answer is not None and answer.replace(".", "").lower() == gold.lower()


def _reply_parts(prediction: Prediction) -> tuple[str | None, str | None]:
    """(answer text, box text): the official result file's `text` and `coor` when given, else one reply."""
    if isinstance(prediction, Mapping) and "box_text" in prediction:
        return as_text(prediction.get("text")), as_text(prediction.get("box_text"))
    reply = reply_text(prediction)
    if reply is None:
        return None, None
    answer_part, _ = split_reasoning(reply)
    return extract_answer(reply), answer_part if _BRACKET.search(answer_part) else reply


def correct(item: Item, prediction: Prediction) -> bool:
    """The answer alone (grounding aside)."""
    return answer_right(_reply_parts(prediction)[0], item.answer)


def hit(item: Item, box_text: str | None) -> tuple[bool, bool]:
    """(IoU > 0.5, a box was read)."""
    box = parse_bbox(box_text)
    if box[:4] == [0.0, 0.0, 0.0, 0.0]:
        return False, False
    e = item.extra
    return iou_xywh(to_xywh(box, e["box_format"], e["width"], e["height"]), e["box"]) > 0.5, True


def _figures(rows: Sequence[tuple[bool, bool]]) -> dict[str, Any]:
    counts = Counter(("C" if right else "W") + ("R" if hit else "M") for right, hit in rows)
    n = len(rows)
    return {
        "questions": n,
        "answer_accuracy": ratio(counts["CR"] + counts["CM"], n),
        "grounding_accuracy": ratio(counts["CR"] + counts["WR"], n),
        "consistency": ratio(counts["CR"], counts["CR"] + counts["CM"] + counts["WR"]),
        **{k: counts[k] for k in ("CR", "CM", "WR", "WM")},
    }


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    rows: dict[str, list[tuple[bool, bool]]] = {}
    no_box = missing = 0
    for item in items:
        prediction = predictions.get(item.id)
        answer, box_text = _reply_parts(prediction)
        missing += answer is None and box_text is None
        is_hit, read_box = hit(item, box_text)
        no_box += not read_box
        rows.setdefault(item.extra["split"], []).append((answer_right(answer, item.answer), is_hit))
    pooled = [r for split_rows in rows.values() for r in split_rows]
    return {
        **_figures(pooled),
        "by_split": {name: _figures(split_rows) for name, split_rows in rows.items()},
        "no_box": no_box,
        "missing": missing,
    }


def from_official(records: Sequence[Mapping[str, Any]], items: Sequence[Item]) -> dict[str, Prediction] | None:
    """Predictions from the official result file, matched in file order: the k-th row of a
    `question_id` is the k-th record of that id."""
    if not records or not all(isinstance(r, Mapping) and {"question_id", "text", "coor"} <= set(r) for r in records):
        return None
    by_key = {(i.extra["record_id"], i.extra["occurrence"]): i for i in items}
    seen: Counter[str] = Counter()
    out: dict[str, Prediction] = {}
    for record in records:
        rid = as_text(record["question_id"]).strip()
        seen[rid] += 1
        item = by_key.get((rid, seen[rid]))
        if item is not None:
            out[item.id] = {"id": item.id, "text": as_text(record["text"]), "box_text": as_text(record["coor"])}
    return out
