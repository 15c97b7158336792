"""FREAK: questions about images that contradict common sense, each with a tempting commonsense answer.

Every question is asked as multiple choice with four options: the correct answer, a commonsense
distractor (what one expects without looking), a generated distractor, and a fixed "the correct answer
is not listed". The first three are put in all 6 orders under the labels A–C; D stays the fixed option.
Free-form, the reply is classified by a judge as correct, a commonsense error (the model said what
common sense expects: a hallucination) or another error.

Layout. The field names below are those this loader reads; they follow the paper's description of each
record (the release format itself could not be checked from here — rename fields if a copy differs)::

    DATA_DIR/freak.json   (or freak.jsonl) records: id, image (path relative to DATA_DIR), question,
                          answer (the correct option's text), commonsense_distractor,
                          generated_distractor, category (optional)

Metrics, multiple choice: `accuracy` = mean over questions of the share right among its orders;
`hallu_rate` = mean share of picks of the commonsense distractor; `not_listed_rate` = share of D picks.
An unparseable reply counts as D (as in the paper). Free form (`open_*`): shares of the judge's labels
over the judged replies; replies without a label are counted in `open_unjudged`.

Loader options: `mode` = `mcq` (default: 6 items per question), `open` (1 free-form item per question)
or `both`; `instruction` (appended to every prompt).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text
from faithproxy.benchmarks.evaluation.mcq import LETTERS, extract_choice, format_options
from faithproxy.clients.judge_base import JudgeBackend
from faithproxy.faithcore.errors import FaithproxyError

NOT_LISTED = "The correct answer is not listed."
ROLES = ("correct", "commonsense", "generated")
ORDERS = tuple(itertools.permutations(range(3)))  # the 6 orders of the three real options
JUDGEMENTS = ("correct", "commonsense_error", "other_error")


def _records(data_dir: Path) -> list[dict[str, Any]]:
    if (path := data_dir / "freak.json").exists():
        return json.loads(path.read_text(encoding="utf-8"))
    if (path := data_dir / "freak.jsonl").exists():
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    raise FileNotFoundError(f"FREAK: expected {data_dir / 'freak.json'} or freak.jsonl")


def load(data_dir: Path, mode: str = "mcq", instruction: str = "") -> list[Item]:
    if mode not in ("mcq", "open", "both"):
        raise ValueError(f"FREAK: mode must be mcq, open or both, not {mode!r}")
    data_dir = Path(data_dir)
    items = []
    for record in _records(data_dir):
        qid = str(record["id"])
        question = str(record["question"]).strip()
        texts = (str(record["answer"]), str(record["commonsense_distractor"]), str(record["generated_distractor"]))
        common = {
            "question_id": qid,
            "category": record.get("category"),
            "correct_text": texts[0],
            "commonsense_text": texts[1],
        }
        image = data_dir / record["image"]
        if mode in ("mcq", "both"):
            for k, order in enumerate(ORDERS):
                options = (*(texts[i] for i in order), NOT_LISTED)
                letter_of = {ROLES[role]: LETTERS[pos] for pos, role in enumerate(order)}
                items.append(
                    Item(
                        id=f"freak-{qid}-o{k}",
                        question=question,
                        prompt=f"{question} Options: {format_options(options)} {instruction}".strip(),
                        answer=letter_of["correct"],
                        image=image,
                        options=options,
                        extra={**common, "format": "mcq", "commonsense_letter": letter_of["commonsense"]},
                    )
                )
        if mode in ("open", "both"):
            items.append(
                Item(
                    id=f"freak-{qid}-open",
                    question=question,
                    prompt=f"{question} {instruction}".strip(),
                    answer=texts[0],
                    image=image,
                    extra={**common, "format": "open"},
                )
            )
    return items


def correct(item: Item, prediction: Prediction) -> bool | None:
    """Multiple choice: the right letter. Free form: the judge's label (None until judged)."""
    if item.extra["format"] == "open":
        label = prediction.get("judgement") if isinstance(prediction, Mapping) else None
        return None if label not in JUDGEMENTS else label == "correct"
    return extract_choice(reply_text(prediction), item.options) == item.answer


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    per_question: dict[str, list[str]] = defaultdict(list)  # outcome of each order: correct|commonsense|other|D
    labels: list[str] = []
    unjudged = 0
    unparsed = 0
    for item in items:
        prediction = predictions.get(item.id)
        if item.extra["format"] == "open":
            label = prediction.get("judgement") if isinstance(prediction, Mapping) else None
            if label in JUDGEMENTS:
                labels.append(label)
            else:
                unjudged += 1
            continue
        choice = extract_choice(reply_text(prediction), item.options)
        if choice is None:
            unparsed += 1
            choice = "D"
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
        for name in ("correct", "commonsense", "not_listed")
    }
    n = len(per_question)
    return {
        "questions": n,
        "mcq_items": sum(len(v) for v in per_question.values()),
        "accuracy": ratio(sum(shares["correct"]), n),
        "hallu_rate": ratio(sum(shares["commonsense"]), n),
        "not_listed_rate": ratio(sum(shares["not_listed"]), n),
        "unparsed": unparsed,
        "open_judged": len(labels),
        "open_accuracy": ratio(labels.count("correct"), len(labels)),
        "open_hallu_rate": ratio(labels.count("commonsense_error"), len(labels)),
        "open_other_error_rate": ratio(labels.count("other_error"), len(labels)),
        "open_unjudged": unjudged,
    }


JUDGE_SYSTEM = (
    "You grade a model's free-form answer to a question about an image that defies common sense. "
    "You are given the question, the right answer, and the answer common sense would suggest instead."
)

JUDGE_TEMPLATE = """Question: {question}
Right answer: {correct}
Commonsense (wrong) answer: {commonsense}
Model's reply: {reply}

Classify the model's final answer with exactly one label:
CORRECT - it agrees with the right answer;
COMMONSENSE_ERROR - it gives the commonsense answer (or something equivalent to it);
OTHER_ERROR - it is wrong in some other way, or gives no answer.
Reply with the label only, on a line starting with "Label:"."""

_LABEL = re.compile(r"\b(CORRECT|COMMONSENSE[_ ]ERROR|OTHER[_ ]ERROR)\b", re.I)


def parse_judgement(text: str) -> str | None:
    """`correct` | `commonsense_error` | `other_error` from the judge's reply (its last label), else None."""
    found = _LABEL.findall(text)
    return found[-1].lower().replace(" ", "_") if found else None


async def judge(
    items: Sequence[Item],
    predictions: Mapping[str, Prediction],
    backend: JudgeBackend | Sequence[JudgeBackend],
    *,
    concurrency: int = 4,
) -> dict[str, dict[str, Any]]:
    """The judge's label for every free-form reply: `{id: {"judgement", "judge_reply"}}`.

    Given several judges, the first one labels. A judge failure leaves the item without a label
    (`judge_error` says why); it counts as unjudged.
    """
    if not isinstance(backend, JudgeBackend):
        backend = backend[0]
    limit = asyncio.Semaphore(concurrency)

    async def one(item: Item) -> tuple[str, dict[str, Any]]:
        reply = reply_text(predictions.get(item.id)) or ""
        user = JUDGE_TEMPLATE.format(
            question=item.question,
            correct=item.extra["correct_text"],
            commonsense=item.extra["commonsense_text"],
            reply=reply.strip() or "(no reply)",
        )
        async with limit:
            try:
                result = await backend.complete(JUDGE_SYSTEM, user)
            except FaithproxyError as exc:
                return item.id, {"judgement": None, "judge_error": str(exc)}
        return item.id, {"judgement": parse_judgement(result.text), "judge_reply": result.text}

    todo = [i for i in items if i.extra["format"] == "open" and predictions.get(i.id) is not None]
    return dict(await asyncio.gather(*(one(i) for i in todo)))
