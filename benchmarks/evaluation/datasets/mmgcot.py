"""MM-GCoT (Wu et al., "Grounded Chain-of-Thought for Multimodal Large Language Models"): does the
answer rest on the right part of the image?

Each question has a short answer and the box of the object the answer depends on. The model answers and
names a box; the answer is scored by exact match, the box by IoU > 0.5 with the gold box, and the two
are compared (consistency: a right answer should come with a hit, a hit with a right answer).

Layout. The loader reads the fields below (the test split as the paper describes it; the exact release
format could not be checked from here)::

    DATA_DIR/mmgcot_test.json   (or .jsonl) records: id, image (path relative to DATA_DIR), question,
                                answer, bbox ([x1, y1, x2, y2] in pixels of the image, or a list of
                                such boxes: a hit on any counts), width and height (optional; read from
                                the image when missing)

Prompt settings (loader option `setting`): `answer_first` (answer, then the box), `grounding_first`
(box, then answer) and `grounding_cot` (steps "Step k: <object> is at [x1, y1, x2, y2]", then the
answer). The first box of the reply is the prediction under `grounding_first`, the last one otherwise.

Box conventions (loader option `box_format`), converted to pixels of the original image before IoU:

- `qwen25` (default; Qwen2.5-VL): absolute pixels x1y1x2y2 of the image as the model saw it. The Qwen
  processor resizes every image to multiples of 28 pixels within a pixel budget (`qwen_resized`); set
  `qwen_min_pixels`/`qwen_max_pixels` when the server runs with other limits than the processor's
  defaults, or `model_width`/`model_height` to give the size outright;
- `qwen2` (Qwen2-VL) and `internvl`: x1y1x2y2 on a 0–1000 grid;
- `norm_xyxy` (0–1), `norm_xywh` (0–1, x y width height).

Metrics: `answer_accuracy` (exact match after lower-casing and dropping periods), `grounding_accuracy`
(IoU > 0.5), `consistency` = CR / (CR + CM + WR) with CR right & hit, CM right & miss, WR wrong & hit
(0–1; the paper prints it ×100), the four counts, and `no_box` (replies without a readable box).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text
from faithproxy.benchmarks.evaluation.mcq import split_reasoning

Box = tuple[float, float, float, float]

SETTINGS = {
    "answer_first": (
        "Answer the question first. Then give the bounding box [x1, y1, x2, y2] of the object in the image "
        "that your answer relies on."
    ),
    "grounding_first": (
        "First give the bounding box [x1, y1, x2, y2] of the object in the image the question is about. "
        "Then answer the question."
    ),
    "grounding_cot": (
        "Reason step by step. In each step name one object in the image you rely on and its bounding box, "
        'written as "Step k: <object> is at [x1, y1, x2, y2]". End with "Answer: <your answer>".'
    ),
}
BOX_FORMATS = ("qwen25", "qwen2", "internvl", "norm_xyxy", "norm_xywh")

_NUMBER = r"-?\d+(?:\.\d+)?"
_BOX = re.compile(rf"[\[(]\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*[\])]")
_ANSWER = re.compile(r"(?:final\s+)?answer\s*(?:is|:)\s*(?=(?P<span>[^\n]*))", re.I)


def _records(data_dir: Path) -> list[dict[str, Any]]:
    if (path := data_dir / "mmgcot_test.json").exists():
        return json.loads(path.read_text(encoding="utf-8"))
    if (path := data_dir / "mmgcot_test.jsonl").exists():
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    raise FileNotFoundError(f"MM-GCoT: expected {data_dir / 'mmgcot_test.json'} or mmgcot_test.jsonl")


def _size(record: dict[str, Any], image: Path) -> tuple[int, int]:
    if record.get("width") and record.get("height"):
        return int(record["width"]), int(record["height"])
    from PIL import Image

    with Image.open(image) as im:
        return im.size


def load(
    data_dir: Path,
    setting: str = "grounding_cot",
    box_format: str = "qwen25",
    model_width: str = "",
    model_height: str = "",
    qwen_min_pixels: str = "",
    qwen_max_pixels: str = "",
) -> list[Item]:
    if setting not in SETTINGS:
        raise ValueError(f"MM-GCoT: setting must be one of {', '.join(SETTINGS)}, not {setting!r}")
    if box_format not in BOX_FORMATS:
        raise ValueError(f"MM-GCoT: box_format must be one of {', '.join(BOX_FORMATS)}, not {box_format!r}")
    data_dir = Path(data_dir)
    items = []
    for record in _records(data_dir):
        image = data_dir / record["image"]
        width, height = _size(record, image)
        boxes = record["bbox"]
        gold = [tuple(map(float, b)) for b in (boxes if isinstance(boxes[0], list | tuple) else [boxes])]
        question = str(record["question"]).strip()
        items.append(
            Item(
                id=f"mmgcot-{record['id']}",
                question=question,
                prompt=f"{question}\n{SETTINGS[setting]}",
                answer=str(record["answer"]),
                image=image,
                extra={
                    "boxes": gold,
                    "width": width,
                    "height": height,
                    "setting": setting,
                    "box_format": box_format,
                    "model_size": (int(model_width), int(model_height))
                    if model_width and model_height
                    else qwen_resized(
                        width,
                        height,
                        min_pixels=int(qwen_min_pixels or QWEN_MIN_PIXELS),
                        max_pixels=int(qwen_max_pixels or QWEN_MAX_PIXELS),
                    ),
                },
            )
        )
    return items


QWEN_PATCH = 28  # 14-pixel patches merged 2 × 2
QWEN_MIN_PIXELS = 4 * 28 * 28  # the Qwen2-VL / Qwen2.5-VL image processors' defaults
QWEN_MAX_PIXELS = 16384 * 28 * 28


def qwen_resized(
    width: int, height: int, *, min_pixels: int = QWEN_MIN_PIXELS, max_pixels: int = QWEN_MAX_PIXELS
) -> tuple[int, int]:
    """(width, height) the Qwen2-VL / Qwen2.5-VL processor resizes an image to: each side rounded to a
    multiple of 28, then scaled (keeping the aspect ratio) into [min_pixels, max_pixels]."""
    f = QWEN_PATCH
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return w, h


def to_pixels(box: Sequence[float], box_format: str, width: int, height: int, model_size=None) -> Box:
    """A predicted box in the model's convention → x1y1x2y2 in pixels of the original image."""
    a, b, c, d = box
    if box_format == "qwen25":
        sx, sy = (width / model_size[0], height / model_size[1]) if model_size else (1.0, 1.0)
        return a * sx, b * sy, c * sx, d * sy
    if box_format in ("qwen2", "internvl"):
        return a * width / 1000, b * height / 1000, c * width / 1000, d * height / 1000
    if box_format == "norm_xyxy":
        return a * width, b * height, c * width, d * height
    if box_format == "norm_xywh":
        return a * width, b * height, (a + c) * width, (b + d) * height
    raise ValueError(f"unknown box format {box_format!r}")


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two x1y1x2y2 boxes (corners in any order); 0 for degenerate boxes."""
    ax1, ax2 = sorted((a[0], a[2]))
    ay1, ay2 = sorted((a[1], a[3]))
    bx1, bx2 = sorted((b[0], b[2]))
    by1, by2 = sorted((b[1], b[3]))
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def boxes_in(text: str) -> list[Box]:
    """Every `[a, b, c, d]` (or `(a, b, c, d)`) in the text, in order."""
    return [tuple(float(v) for v in m.groups()) for m in _BOX.finditer(text)]  # type: ignore[misc]


def normalize_answer(text: str) -> str:
    """MM-GCoT's comparison form: lower case, periods removed, spaces trimmed."""
    return " ".join(text.lower().replace(".", "").split())


def extract_answer(text: str) -> str | None:
    """The short answer: the last "Answer: ..." / "the answer is ..." span, else the last line, boxes
    removed. Only the part after `</think>` counts when the reply has one."""
    answer, _ = split_reasoning(text)
    spans = [m["span"] for m in _ANSWER.finditer(answer)]
    lines = [line for line in answer.splitlines() if line.strip() and not line.lstrip().lower().startswith("step")]
    candidate = spans[-1] if spans else (lines[-1] if lines else "")
    candidate = _BOX.sub("", candidate).strip().strip("*`\"' ")
    return candidate or None


def correct(item: Item, prediction: Prediction) -> bool:
    """The answer alone (grounding aside)."""
    answer = extract_answer(reply_text(prediction) or "")
    return answer is not None and normalize_answer(answer) == normalize_answer(item.answer)


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    counts = {"CR": 0, "CM": 0, "WR": 0, "WM": 0}
    no_box = 0
    for item in items:
        reply = reply_text(predictions.get(item.id)) or ""
        right = correct(item, reply)
        boxes = boxes_in(split_reasoning(reply)[0]) or boxes_in(reply)  # grounded steps may sit in the reasoning
        hit = False
        if boxes:
            box = boxes[0] if item.extra["setting"] == "grounding_first" else boxes[-1]
            e = item.extra
            pixels = to_pixels(box, e["box_format"], e["width"], e["height"], e["model_size"])
            hit = any(iou(pixels, gold) > 0.5 for gold in e["boxes"])
        else:
            no_box += 1
        counts[("C" if right else "W") + ("R" if hit else "M")] += 1
    n = len(items)
    return {
        "questions": n,
        "answer_accuracy": ratio(counts["CR"] + counts["CM"], n),
        "grounding_accuracy": ratio(counts["CR"] + counts["WR"], n),
        "consistency": ratio(counts["CR"], counts["CR"] + counts["CM"] + counts["WR"]),
        **counts,
        "no_box": no_box,
    }
