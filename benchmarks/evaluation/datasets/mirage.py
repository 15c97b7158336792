"""MIRAGE: hallucinations in multimodal reasoning chains, scored on the answer and on the chain itself.

Layout. The loader reads the fields below (the paper's description of a record; the exact release
format could not be checked from here)::

    DATA_DIR/mirage.json   (or mirage.jsonl) records: id, image (path relative to DATA_DIR), question,
                           options (list of option texts; absent or empty for open questions),
                           answer (a letter or option text for multiple choice, else the answer),
                           answer_type ("multiple_choice" | "deterministic" | "approximate"),
                           tolerance (relative error allowed for approximate answers; default 0.05),
                           references (list of reference chains, each a list of step texts: the
                           reference and its rewrites), claims (reference claims, list of texts;
                           optional), hallucination_type (spatial | logical | factuality | context |
                           fabrication)

Metrics:

- `accuracy`: multiple choice by the chosen letter, deterministic answers by exact match (numbers as
  numbers), approximate ones by relative error |pred − gold| / |gold| ≤ tolerance;
- `f_step`, `f_claim`: a judge splits the model's chain into at most 10 steps (claims) and matches them
  with the reference's; precision = matched predicted / predicted, recall = matched reference /
  reference, F1 of the two, averaged over the judged items;
- `lhs_mean`, `lhs_std`: LLM Hallucination Score. Each of M judges scores the chain against each of N
  reference chains on five dimensions (0–10, higher is better): factual accuracy, logical consistency,
  reasoning completeness, conceptual accuracy, strategy appropriateness. An item's LHS is the mean over
  judges and references of the mean of the five; mean and (population) std over the items;
- `by_type`: accuracy and LHS for each of the five hallucination types.

Loader options: `instruction` (appended to every prompt).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text
from faithproxy.benchmarks.evaluation.mcq import (
    LETTERS,
    extract_choice,
    final_answer_span,
    format_options,
    normalize_text,
    split_reasoning,
)
from faithproxy.clients.judge_base import JudgeBackend
from faithproxy.faithcore.errors import FaithproxyError

HALLUCINATION_TYPES = ("spatial", "logical", "factuality", "context", "fabrication")
ANSWER_TYPES = ("multiple_choice", "deterministic", "approximate")
DIMENSIONS = (
    "factual accuracy",
    "logical consistency",
    "reasoning completeness",
    "conceptual accuracy",
    "strategy appropriateness",
)
DEFAULT_TOLERANCE = 0.05
MAX_UNITS = 10  # at most this many steps (claims) are extracted from a chain

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _records(data_dir: Path) -> list[dict[str, Any]]:
    if (path := data_dir / "mirage.json").exists():
        return json.loads(path.read_text(encoding="utf-8"))
    if (path := data_dir / "mirage.jsonl").exists():
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    raise FileNotFoundError(f"MIRAGE: expected {data_dir / 'mirage.json'} or mirage.jsonl")


def load(data_dir: Path, instruction: str = "") -> list[Item]:
    data_dir = Path(data_dir)
    items = []
    for record in _records(data_dir):
        options = tuple(str(o) for o in record.get("options") or ())
        answer_type = record.get("answer_type") or ("multiple_choice" if options else "deterministic")
        if answer_type not in ANSWER_TYPES:
            raise ValueError(f"MIRAGE: answer_type {answer_type!r} is not one of {ANSWER_TYPES}")
        answer = str(record["answer"]).strip()
        if answer_type == "multiple_choice":
            answer = _gold_letter(answer, options)
        question = str(record["question"]).strip()
        prompt = f"{question} Options: {format_options(options)}" if options else question
        items.append(
            Item(
                id=f"mirage-{record['id']}",
                question=question,
                prompt=f"{prompt} {instruction}".strip(),
                answer=answer,
                image=data_dir / record["image"] if record.get("image") else None,
                options=options,
                extra={
                    "answer_type": answer_type,
                    "tolerance": float(record.get("tolerance", DEFAULT_TOLERANCE)),
                    "references": [list(chain) for chain in record.get("references") or ()],
                    "claims": list(record.get("claims") or ()),
                    "hallucination_type": record.get("hallucination_type"),
                },
            )
        )
    return items


def _gold_letter(answer: str, options: Sequence[str]) -> str:
    if len(answer) == 1 and answer.upper() in LETTERS[: len(options)]:
        return answer.upper()
    for i, option in enumerate(options):
        if normalize_text(option) == normalize_text(answer):
            return LETTERS[i]
    raise ValueError(f"MIRAGE: answer {answer!r} is neither a letter nor an option of {options!r}")


def parse_number(text: str | None) -> float | None:
    """The first number in the text (thousands separators and exponents allowed), else None."""
    for match in _NUMBER.finditer(text or ""):
        if re.search(r"\d", match.group(0)):
            return float(match.group(0).replace(",", ""))
    return None


def answer_correct(item: Item, reply: str | None) -> bool:
    kind = item.extra["answer_type"]
    if kind == "multiple_choice":
        return extract_choice(reply, item.options) == item.answer
    said = final_answer_span(reply)
    if said is None:
        return False
    gold_number, said_number = parse_number(item.answer), parse_number(said)
    if kind == "approximate":
        if gold_number is None or said_number is None:
            return False
        if gold_number == 0:
            return said_number == 0
        return abs(said_number - gold_number) / abs(gold_number) <= item.extra["tolerance"] + 1e-12  # float noise
    if gold_number is not None and said_number is not None and re.fullmatch(r"[-+\d.,eE\s]+", item.answer.strip()):
        return math.isclose(said_number, gold_number, rel_tol=0, abs_tol=1e-9)  # "3.50" is "3.5 cm"
    return normalize_text(said) == normalize_text(item.answer)


def correct(item: Item, prediction: Prediction) -> bool:
    return answer_correct(item, reply_text(prediction))


def f1_of_matches(match: Mapping[str, int]) -> float:
    """F1 from the judge's counts `{"pred", "matched_pred", "ref", "matched_ref"}`; 0 when nothing matched."""
    precision = match["matched_pred"] / match["pred"] if match["pred"] else 0.0
    recall = match["matched_ref"] / match["ref"] if match["ref"] else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def lhs_of(scores: Sequence[Sequence[float]]) -> float | None:
    """An item's LHS from its M × N score lists (five numbers each); None without any."""
    means = [statistics.fmean(s) for s in scores if len(s) == len(DIMENSIONS)]
    return statistics.fmean(means) if means else None


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.pstdev(values)


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    right: dict[str, bool] = {}
    f_step: list[float] = []
    f_claim: list[float] = []
    lhs: dict[str, float] = {}
    for item in items:
        prediction = predictions.get(item.id)
        right[item.id] = answer_correct(item, reply_text(prediction))
        if isinstance(prediction, Mapping):
            if prediction.get("step_match"):
                f_step.append(f1_of_matches(prediction["step_match"]))
            if prediction.get("claim_match"):
                f_claim.append(f1_of_matches(prediction["claim_match"]))
            if (value := lhs_of(prediction.get("lhs_scores") or ())) is not None:
                lhs[item.id] = value
    lhs_mean, lhs_std = _mean_std(list(lhs.values()))
    by_type: dict[str, dict[str, Any]] = {}
    grouped: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        grouped[item.extra["hallucination_type"] or "unknown"].append(item)
    order = {name: k for k, name in enumerate(HALLUCINATION_TYPES)}
    for name in sorted(grouped, key=lambda n: (order.get(n, len(order)), n)):
        members = grouped[name]
        mean, std = _mean_std([lhs[i.id] for i in members if i.id in lhs])
        by_type[name] = {
            "questions": len(members),
            "accuracy": ratio(sum(right[i.id] for i in members), len(members)),
            "lhs_mean": mean,
            "lhs_std": std,
        }
    return {
        "questions": len(items),
        "accuracy": ratio(sum(right.values()), len(items)),
        "f_step": statistics.fmean(f_step) if f_step else None,
        "f_claim": statistics.fmean(f_claim) if f_claim else None,
        "lhs_mean": lhs_mean,
        "lhs_std": lhs_std,
        "step_judged": len(f_step),
        "claim_judged": len(f_claim),
        "lhs_judged": len(lhs),
        "by_type": by_type,
    }


# --- judging ------------------------------------------------------------------------------------------

MATCH_SYSTEM = "You compare a model's reasoning with a reference solution, unit by unit."
MATCH_TEMPLATE = """Question: {question}

Reference {unit}s:
{reference}

Model's reasoning:
{chain}

Split the model's reasoning into its {unit}s (at most {max_units}). Count how many of the model's {unit}s
agree with some reference {unit}, and how many reference {unit}s are covered by some {unit} of the model.
Answer with exactly these four lines:
Predicted {unit}s: <number>
Matched predicted: <number>
Reference {unit}s: <number>
Matched reference: <number>"""

LHS_SYSTEM = "You grade a model's reasoning chain against a reference chain for hallucinations."
LHS_TEMPLATE = """Question: {question}

Reference reasoning:
{reference}

Model's reasoning:
{chain}

Score the model's reasoning from 0 (worst) to 10 (best) on each dimension, one line each:
Factual accuracy: <score>
Logical consistency: <score>
Reasoning completeness: <score>
Conceptual accuracy: <score>
Strategy appropriateness: <score>"""


def parse_match(text: str) -> dict[str, int] | None:
    """The four counts of a matching reply, clamped so matched ≤ total; None if any is missing."""
    fields = {
        "pred": r"predicted (?:step|claim)s?",
        "matched_pred": r"matched predicted",
        "ref": r"reference (?:step|claim)s?",
        "matched_ref": r"matched reference",
    }
    found = {}
    for key, label in fields.items():
        matches = re.findall(rf"^\W*{label}\W*:\s*\**\s*(\d+)", text, re.I | re.M)
        if not matches:
            return None
        found[key] = int(matches[-1])
    found["pred"] = min(found["pred"], MAX_UNITS)
    found["matched_pred"] = min(found["matched_pred"], found["pred"])
    found["matched_ref"] = min(found["matched_ref"], found["ref"])
    return found


def parse_lhs(text: str) -> list[float] | None:
    """The five dimension scores (clamped to 0–10) in DIMENSIONS order; None if any is missing."""
    scores = []
    for name in DIMENSIONS:
        matches = re.findall(rf"^\W*{name}\W*:\s*\**\s*(\d+(?:\.\d+)?)", text, re.I | re.M)
        if not matches:
            return None
        scores.append(min(10.0, max(0.0, float(matches[-1]))))
    return scores


def _chain_of(prediction: Prediction) -> str:
    text = reply_text(prediction) or ""
    answer, reasoning = split_reasoning(text)
    return (reasoning or answer).strip() or "(empty)"


async def judge(
    items: Sequence[Item],
    predictions: Mapping[str, Prediction],
    backend: JudgeBackend | Sequence[JudgeBackend],
    *,
    concurrency: int = 4,
) -> dict[str, dict[str, Any]]:
    """Step and claim matches (first judge) and LHS scores (every judge × every reference) for each
    answered item: `{id: {"step_match", "claim_match", "lhs_scores", "judge_errors"}}`."""
    backends = [backend] if isinstance(backend, JudgeBackend) else list(backend)
    limit = asyncio.Semaphore(concurrency)

    async def ask(b: JudgeBackend, system: str, user: str) -> str | None:
        async with limit:
            try:
                return (await b.complete(system, user)).text
            except FaithproxyError:
                return None

    async def one(item: Item) -> tuple[str, dict[str, Any]]:
        chain = _chain_of(predictions.get(item.id))
        refs = item.extra["references"]
        out: dict[str, Any] = {"step_match": None, "claim_match": None, "lhs_scores": [], "judge_errors": 0}
        if not refs:
            return item.id, out
        units = {"step": refs[0], "claim": item.extra["claims"]}
        tasks = {
            unit: ask(
                backends[0],
                MATCH_SYSTEM,
                MATCH_TEMPLATE.format(
                    question=item.question,
                    unit=unit,
                    reference="\n".join(f"{k + 1}. {s}" for k, s in enumerate(lines)),
                    chain=chain,
                    max_units=MAX_UNITS,
                ),
            )
            for unit, lines in units.items()
            if lines
        }
        lhs_calls = [
            ask(b, LHS_SYSTEM, LHS_TEMPLATE.format(question=item.question, reference="\n".join(ref), chain=chain))
            for b in backends
            for ref in refs
        ]
        replies = await asyncio.gather(*tasks.values(), *lhs_calls)
        for unit, reply in zip(tasks, replies[: len(tasks)], strict=True):
            out[f"{unit}_match"] = parse_match(reply) if reply else None
            out["judge_errors"] += out[f"{unit}_match"] is None
        for reply in replies[len(tasks) :]:
            parsed = parse_lhs(reply) if reply else None
            if parsed is None:
                out["judge_errors"] += 1
            else:
                out["lhs_scores"].append(parsed)
        return item.id, out

    todo = [i for i in items if predictions.get(i.id) is not None]
    return dict(await asyncio.gather(*(one(i) for i in todo)))
