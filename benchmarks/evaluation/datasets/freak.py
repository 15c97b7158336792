"""FREAK (Yin et al., ICLR 2026): photorealistic images that contradict common sense, each question with a
tempting commonsense answer.

Layout: the hub dataset (hansQAQ/FREAK) as downloaded, the way the official code reads it
(`datasets.load_dataset("./freak", split="test")`): Parquet files under DATA_DIR
(`DATA_DIR/data/test-0000k-of-00005.parquet`; reading them needs `pyarrow`). Columns (the official
build/upload.py): `id`, `image` (the hub's image struct `{"bytes", "path"}`), `question`, `item`,
`category` (list), `type` ("mcq" | "fib"), `options` (mcq: 4 texts, [0] the correct answer, [1] the
commonsense answer, [2] another, [3] "the correct answer is not listed"), `ground_truth` and
`hallu_answer` (fib: the right answer and the typical, commonsense, error). Images are written once to
`DATA_DIR/.faithproxy-images/`.

Scoring follows the official eval/evaluate.py:

- multiple choice: each question is asked in 6 orders of its first three options (D stays "not
  listed"); the letter is read from the reply by the official rules (`official_choice`: the text after
  `</think>`, else the whole reply; `<answer>X</answer>`; a bare letter; the last character; "A." /
  "is A" / "is: A" / "{A}"; otherwise D). `accuracy` = mean over questions of the share of orders
  answered right, `hallu_rate` = mean share of picks of the commonsense option; `not_listed_rate`
  (share of D picks) and `unparsed` (replies read as D by the last rule, or missing) are ours;
- free form (fib): a judge labels the reply `correct`, `typical` (the commonsense error: a
  hallucination) or `wrong` (we store them as correct / commonsense_error / other_error); a judge reply without a
  readable `<judge>` tag is `wrong`, as the official `llm_as_judge` scores it 0. `open_accuracy` and
  `open_hallu_rate` are the shares over the judged replies, `open_unjudged` counts the replies whose judge
  request failed (the official script would stop there). These figures depend on the judge model;
- `total_accuracy` and `total_hallu_rate`: the official totals, over multiple-choice questions and
  judged free-form ones together.

A failed request is never read as an answer: a multiple-choice order without a reply counts as D (the
official fallback for a reply it cannot read) and is reported in the run's `errors`; a free-form one stays
unjudged.

Loader options: `mode` = `both` (default, every record), `mcq` or `open` (free-form records only);
`instruction` (appended to every prompt).
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text
from faithproxy.benchmarks.evaluation.datasets.release import (
    DUPLICATE_RECORD,
    MISSING_IMAGE,
    UNKNOWN_VALUE,
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
from faithproxy.clients.judge_base import JudgeBackend
from faithproxy.faithcore.errors import FaithproxyError
from faithproxy.faithcore.images import parse_image_url

OFFICIAL = ("accuracy", "hallu_rate", "open_accuracy", "open_hallu_rate", "total_accuracy", "total_hallu_rate")
# The official permutations: the options shown as A, B, C (D fixed), and the letters the correct and the
# commonsense options land on.
ORDERS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
JUDGEMENTS = ("correct", "commonsense_error", "other_error")
TYPES = ("mcq", "fib")
MCQ_INSTRUCTION = (
    "Here is an image with a multiple choice question about it. Answer faithfully to the image; the question may "
    "be confusing or the image unusual. Answer ONLY with the letter of the correct choice."
)
FIB_INSTRUCTION = (
    "Here is an image with a question about it. Answer faithfully to the image; the question may be confusing or "
    "the image unusual, so rely on what the image shows."
)


def _image(record: Mapping[str, Any], data_dir: Path, cache: Path) -> Path | None:
    image = record.get("image")
    if isinstance(image, Mapping):
        if image.get("bytes"):
            return write_cached(cache, f"freak-{record.get('id')}", bytes(image["bytes"]), as_text(image.get("path")))
        if image.get("path"):
            return data_dir / as_text(image["path"])
    return None


def read(data_dir: Path, mode: str = "both", instruction: str = "") -> Release:
    if mode not in ("mcq", "open", "both"):
        raise ValueError(f"FREAK: mode must be mcq, open or both, not {mode!r}")
    data_dir = Path(data_dir)
    release = Release("freak")
    files = parquet_files(data_dir)
    if not files:
        return missing_release_file(release, data_dir / "data" / "test-*.parquet", "FREAK Parquet files")
    cache = cache_dir(data_dir)
    seen: set[tuple[str, str]] = set()
    for path, n, record in read_parquet_rows(files):
        kind, qid = as_text(record.get("type")).strip(), as_text(record.get("id")).strip()
        if mode == "mcq" and kind != "mcq" or mode == "open" and kind == "mcq":
            continue
        release.count(kind or "?")
        where = f"{path.name} row {n} (id {qid or '?'}, {kind or '?'})"
        question = as_text(record.get("question")).strip()
        if kind not in TYPES:
            release.problem(UNKNOWN_VALUE, where, f"type {kind!r} is not mcq or fib")
            continue
        options = [as_text(o).strip() for o in record.get("options") or ()]
        ground_truth = as_text(record.get("ground_truth")).strip()
        if not qid or not question or kind == "mcq" and (len(options) != 4 or not all(options)):
            release.problem(UNREADABLE_RECORD, where, "needs id, question and, for mcq, 4 options")
            continue
        if kind == "fib" and not ground_truth:
            release.problem(UNREADABLE_RECORD, where, "a free-form record without ground_truth cannot be judged")
            continue
        if (kind, qid) in seen:
            release.problem(DUPLICATE_RECORD, where, f"id {qid} occurs twice among the {kind} records")
            continue
        seen.add((kind, qid))
        image = _image(record, data_dir, cache)
        if image is None:
            release.problem(MISSING_IMAGE, where, "the record has no image")
            continue
        if found := image_problem(image):
            release.problem(found[0], where, found[1], image)
            continue
        common = {"question_id": qid, "category": list(record.get("category") or []), "item": record.get("item")}
        if kind == "mcq":
            for k, order in enumerate(ORDERS):
                shown = [options[i] for i in order] + [options[3]]
                block = "\n".join(f"{letter}. {text}" for letter, text in zip("ABCD", shown, strict=True))
                letter_of = {role: "ABC"[order.index(role)] for role in range(3)}
                prompt = f"{MCQ_INSTRUCTION}\nQuestion: {question}\nChoices:\n{block}\nYour answer: {instruction}"
                release.items.append(
                    Item(
                        id=f"freak-{qid}-o{k}",
                        question=question,
                        prompt=prompt.strip(),
                        answer=letter_of[0],
                        image=image,
                        options=tuple(shown),
                        extra={**common, "format": "mcq", "commonsense_letter": letter_of[1]},
                    )
                )
        else:
            prompt = f"{FIB_INSTRUCTION}\nQuestion: {question}\nYour answer: {instruction}"
            release.items.append(
                Item(
                    id=f"freak-{qid}-open",
                    question=question,
                    prompt=prompt.strip(),
                    answer=ground_truth,
                    image=image,
                    extra={
                        **common,
                        "format": "open",
                        "correct_text": ground_truth,
                        "commonsense_text": as_text(record.get("hallu_answer")).strip(),
                    },  # fmt: skip
                )
            )
    return release


load = strict(read)

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def official_choice(text: str) -> tuple[str, bool]:
    """The letter the official evaluate.py reads from a reply, and whether a rule found it (False: the
    final fallback to D). The reasoning part is dropped as the official thinking mode does; an empty
    reply, where the official script would fail, is D."""
    if "</think>" in text and "<think>" in text:
        text = text[text.index("</think>") + len("</think>") :].strip()
    found = _ANSWER_TAG.findall(text)
    choice = found[0] if found else text
    if choice in ("A", "B", "C", "D"):
        return choice, True
    if choice and choice[-1] in "ABCD":
        return choice[-1], True
    for letter in "ABCD":
        if any(p in choice for p in (f"{letter}.", f"is {letter}", f"is: {letter}", f"{{{letter}}}")):
            return letter, True
    return "D", False


def correct(item: Item, prediction: Prediction) -> bool | None:
    """Multiple choice: the right letter. Free form: the judge's label (None until judged)."""
    if item.extra["format"] == "open":
        label = prediction.get("judgement") if isinstance(prediction, Mapping) else None
        return None if label not in JUDGEMENTS else label == "correct"
    text = reply_text(prediction)
    return text is not None and official_choice(text)[0] == item.answer


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    per_question: dict[str, list[str]] = defaultdict(list)  # outcome of each order
    labels: list[str] = []
    unjudged = unparsed = 0
    for item in items:
        prediction = predictions.get(item.id)
        if item.extra["format"] == "open":
            label = prediction.get("judgement") if isinstance(prediction, Mapping) else None
            if label in JUDGEMENTS:
                labels.append(label)
            else:
                unjudged += 1
            continue
        text = reply_text(prediction)
        if text is None:
            unparsed += 1  # no reply to read: D, as the official fallback reads what it cannot parse
            outcome = "failed"
        else:
            choice, found = official_choice(text)
            unparsed += not found
            outcome = (
                "correct"
                if choice == item.answer
                else "commonsense"
                if choice == item.extra["commonsense_letter"]
                else "not_listed"
                if choice == "D"
                else "other"
            )
        per_question[item.extra["question_id"]].append(outcome)
    shares = {
        name: [v.count(name) / len(v) for v in per_question.values()]
        for name in ("correct", "commonsense", "not_listed", "failed")
    }
    n, judged = len(per_question), len(labels)
    return {
        "questions": n,
        "mcq_items": sum(len(v) for v in per_question.values()),
        "accuracy": ratio(sum(shares["correct"]), n),
        "hallu_rate": ratio(sum(shares["commonsense"]), n),
        "not_listed_rate": ratio(sum(shares["not_listed"]) + sum(shares["failed"]), n),
        "unparsed": unparsed,
        "incomplete_questions": sum(len(v) != len(ORDERS) for v in per_question.values()),
        "open_judged": judged,
        "open_accuracy": ratio(labels.count("correct"), judged),
        "open_hallu_rate": ratio(labels.count("commonsense_error"), judged),
        "open_other_error_rate": ratio(labels.count("other_error"), judged),
        "open_unjudged": unjudged,
        "total_accuracy": ratio(sum(shares["correct"]) + labels.count("correct"), n + judged),
        "total_hallu_rate": ratio(sum(shares["commonsense"]) + labels.count("commonsense_error"), n + judged),
        "judge_dependent": [
            "open_accuracy",
            "open_hallu_rate",
            "open_other_error_rate",
            "total_accuracy",
            "total_hallu_rate",
        ],  # fmt: skip
    }


JUDGE_SYSTEM = (
    "You check a model's free-form answer to a question about an image that may defy common sense. You are given "
    "the right answer and the typical wrong answer (what common sense suggests). Judge only by these two answers "
    "and the model's reply, not by your own view of the image or your common sense. Text marked with '#' in "
    "either answer is what a reply must cover to fall in that category. A reply that reaches the right "
    "conclusion by analysis contradicting the right answer is not correct."
)

JUDGE_TEMPLATE = """Question: {question}
Right answer: {correct}
Commonsense (wrong) answer: {commonsense}

Model's reply: {reply}

Give your judgement as <judge>correct</judge>, <judge>typical</judge> (the reply gives the typical error) or
<judge>wrong</judge> (wrong in another way, or no answer), then a short reason in <explanation></explanation>."""

_JUDGE_TAG = re.compile(r"<judge>\s*(.*?)\s*</judge>", re.I | re.S)
_OFFICIAL_LABELS = {"correct": "correct", "typical": "commonsense_error", "wrong": "other_error"}


def parse_judgement(text: str) -> str:
    """`correct` | `commonsense_error` | `other_error`, read as the official `llm_as_judge` reads the
    judge's reply: the first `<judge>` tag, `correct` scores 1, `typical` -1, anything else (another
    word, no tag at all) 0, which is neither right nor a hallucination: `other_error`."""
    tags = _JUDGE_TAG.findall(text)
    return _OFFICIAL_LABELS.get(tags[0].strip().lower(), "other_error") if tags else "other_error"


async def judge(
    items: Sequence[Item],
    predictions: Mapping[str, Prediction],
    backend: JudgeBackend | Sequence[JudgeBackend],
    *,
    concurrency: int = 4,
) -> dict[str, dict[str, Any]]:
    """The judge's label for every free-form reply (the image goes with it, as in the official script):
    `{id: {"judgement", "judge_reply"}}`. Given several judges, the first one labels. A judge failure
    leaves the item without a label (`judge_error` says why); it counts as unjudged."""
    from faithproxy.benchmarks.evaluation.run import image_data_url

    if not isinstance(backend, JudgeBackend):
        backend = backend[0]
    limit = asyncio.Semaphore(concurrency)

    async def one(item: Item) -> tuple[str, dict[str, Any]]:
        reply = reply_text(predictions.get(item.id)) or ""
        user = JUDGE_TEMPLATE.format(
            question=item.question,
            correct=item.extra["correct_text"],
            commonsense=item.extra["commonsense_text"] or "(none given)",
            reply=reply.strip() or "(no reply)",
        )
        images = [parse_image_url(image_data_url(item.image))] if item.image is not None else []
        async with limit:
            try:
                result = await backend.complete(JUDGE_SYSTEM, user, images)
            except FaithproxyError as exc:
                return item.id, {"judgement": None, "judge_error": str(exc)}
        return item.id, {"judgement": parse_judgement(result.text), "judge_reply": result.text}

    todo = [i for i in items if i.extra["format"] == "open" and predictions.get(i.id) is not None]
    return dict(await asyncio.gather(*(one(i) for i in todo)))
