"""MIRAGE (Dong et al., 2025): hallucinations in multimodal reasoning chains, scored on the answer and on
the chain itself.

Layout: the released `mirage.tsv` (DongSky/mirage on the hub) in DATA_DIR. A TSV with a header;
columns read: `index` (optional; else the row number), `prompt` (the question as asked), `image` (a file
name or base64), `answer`, `question_type` (`multi_choice`, `approx`, anything else: an exact numeric
answer), `choices` (a Python list literal, for multiple choice), `normalized_classification` (one of
Algebraic, Arithmetic, Geometry, Logical, Scientific, Spatial, Statistical), the reference chains
`refine_thinking`, `rephrase_thinking_1`, `rephrase_thinking_6`, and, when present, `extract_claims`
(the reference claims and steps, tagged `<claim>` / `<step>`). The `image` cell is read as the official
`to_base64_image` reads it: a file name (the hub also ships `mirage_images.zip`; unzipped into DATA_DIR,
each cell names its JPG relative to DATA_DIR), else base64, decoded once to `DATA_DIR/.faithproxy-images/`;
a URL is a problem (nothing is downloaded).

Answer scoring follows the official `benchmark_eval.py` (`MIX` and `score`):

- `multi_choice`: right when the chosen letter (`mcq.extract_choice`; the official script asks an LLM
  to extract it) is the `answer` letter;
- `approx`: the number the reply ends on (the last number of its `<answer>` tag or final answer; the
  official script asks an LLM) parsed like the gold: an integer gold needs an integer reply, a float
  gold a float, a list gold a list; right when equal or when min(pred/gold, gold/pred) >= 0.95 (lists:
  equal only);
- anything else: the same parse, right only when equal;
- a gold that is neither a number nor a list scores 0, as in the official script;
- `accuracy` overall and per `normalized_classification` class (`by_class`), per `question_type`
  (`by_question_type`). Fractions (0-1).

Chain scoring needs a judge (`--judge-url`), and its figures depend on the judge model (listed in
`judge_dependent`):

- `claim_*`, `step_*` (precision, recall, F1): the judge splits the model's reasoning into claims
  (steps), labels each MATCH / REASONABLE / CONFLICT against the reference, and each reference one
  MATCH / CONFLICT against the model's; precision = (MATCH + REASONABLE) / predicted, recall = MATCH /
  reference, F1 of the two; means over the judged items, as the official `mirage_f1_eval.score`;
- `lhs_mean`, `lhs_std`: each judge scores the chain against each of the three reference chains on the
  official five dimensions, 1 (worst) to 5 (best); an item's LHS is the mean over judges and references
  of the mean of the five; mean and population std over the items.

Loader options: `instruction` (appended to every prompt).
"""

from __future__ import annotations

import ast
import asyncio
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.datasets import Item, Prediction, ratio, reply_text
from faithproxy.benchmarks.evaluation.datasets.release import (
    DUPLICATE_RECORD,
    MISSING_IMAGE,
    UNKNOWN_VALUE,
    UNMATCHABLE_ANSWER,
    UNREADABLE_RECORD,
    Release,
    as_text,
    cache_dir,
    decode_base64,
    image_problem,
    missing_release_file,
    read_tsv_rows,
    strict,
    verdict_of,
    write_cached,
)
from faithproxy.benchmarks.evaluation.mcq import LETTERS, extract_choice, final_answer_span, split_reasoning
from faithproxy.clients.judge_base import JudgeBackend
from faithproxy.faithcore.errors import FaithproxyError

OFFICIAL = ("accuracy", "by_class")
CLASSES = ("Algebraic", "Arithmetic", "Geometry", "Logical", "Scientific", "Spatial", "Statistical")
REFERENCES = ("refine_thinking", "rephrase_thinking_1", "rephrase_thinking_6")
DIMENSIONS = (
    "Factual Accuracy",
    "Logical Consistency",
    "Reasoning Completeness",
    "Conceptual Reasoning Accuracy",
    "Strategy Appropriateness",
)
APPROX_RATE = 0.95


def _choices(text: str) -> list[str] | None:
    if not text.strip():
        return []
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return [str(v) for v in value] if isinstance(value, list | tuple) else None


def _image(cell: str, data_dir: Path, cache: Path, index: str) -> tuple[Path | None, str]:
    """The image of a row, read the way the official `to_base64_image` reads the cell: a file (the
    `mirage_images.zip` layout: a path relative to DATA_DIR), else base64 (written to the cache); a URL
    is refused, nothing is fetched. (None, why) when there is no image."""
    if not cell:
        return None, "the image cell is empty"
    if re.match(r"https?://", cell):
        return None, f"the image is a URL ({cell[:80]}): download it into DATA_DIR and name the file instead"
    looks_like_a_name = len(cell) < 1024 and not cell.startswith("data:")
    if looks_like_a_name and (data_dir / cell).is_file():
        return data_dir / cell, ""
    data = decode_base64(cell)
    if data is not None:
        return write_cached(cache, f"mirage-{index}", data), ""
    if looks_like_a_name:  # a file that is not there: image_problem names it (mirage_images.zip not unpacked?)
        return data_dir / cell, ""
    return None, "the image cell is neither a file under DATA_DIR nor base64"


def read(data_dir: Path, instruction: str = "") -> Release:
    data_dir = Path(data_dir)
    release = Release("mirage")
    path = data_dir / "mirage.tsv"
    if not path.exists():
        return missing_release_file(release, path, "mirage.tsv")
    cache = cache_dir(data_dir)
    seen: set[str] = set()
    for n, row in read_tsv_rows(path):
        index = as_text(row.get("index")).strip() or str(n)
        qtype = as_text(row.get("question_type")).strip()
        release.count(qtype or "?")
        where = f"mirage.tsv row {n} (index {index})"
        prompt, answer = as_text(row.get("prompt")).strip(), as_text(row.get("answer")).strip()
        choices = _choices(as_text(row.get("choices")))
        if not prompt or not answer or choices is None:
            release.problem(UNREADABLE_RECORD, where, "needs prompt, answer and choices readable as a list")
            continue
        classification = as_text(row.get("normalized_classification")).strip()
        unknown = []
        if classification not in CLASSES:
            unknown.append(f"normalized_classification {classification!r} is not one of {', '.join(CLASSES)}")
        if unknown:
            release.problem(UNKNOWN_VALUE, where, "; ".join(unknown))
            continue
        item_id = f"mirage-{index}"
        if item_id in seen:
            release.problem(DUPLICATE_RECORD, where, f"index {index} occurs twice")
            continue
        seen.add(item_id)
        if qtype == "multi_choice" and answer.upper() not in LETTERS[: len(choices)]:
            release.note(UNMATCHABLE_ANSWER, where, f"answer {answer!r} is not the letter of one of its "
                         f"{len(choices)} choices: the official scorer counts it wrong whatever the reply")  # fmt: skip
        image, missing = _image(as_text(row.get("image")).strip(), data_dir, cache, index)
        if image is None:
            release.problem(MISSING_IMAGE, where, missing)
            continue
        if found := image_problem(image):
            release.problem(found[0], where, found[1], image)
            continue
        text = prompt
        if qtype == "multi_choice" and not all(c in prompt for c in choices):
            text += "\n" + "\n".join(f"{LETTERS[k]}. {c}" for k, c in enumerate(choices))
        release.items.append(
            Item(
                id=item_id,
                question=prompt,
                prompt=f"{text} {instruction}".strip(),
                answer=answer,
                image=image,
                options=tuple(choices) if qtype == "multi_choice" else (),
                extra={
                    "question_type": qtype,
                    "classification": classification,
                    "references": [r for k in REFERENCES if (r := as_text(row.get(k)).strip())],
                    "reference_units": as_text(row.get("extract_claims")).strip(),
                },
            )
        )
    return release


load = strict(read)

# ------------------------------------------------------------------------------------------ answers

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LIST = re.compile(r"\[[^\[\]]*\]")
_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.I | re.S)


def _gold_kind(answer: str) -> tuple[str, Any]:
    """The official parse of the gold: int, else float, else a literal (list), else str."""
    for kind, parse in (("int", int), ("float", float), ("list", ast.literal_eval)):
        try:
            return kind, parse(answer)
        except (ValueError, SyntaxError, TypeError):
            continue
    return "str", answer


def reply_number(text: str | None, kind: str) -> str | None:
    """What the official LLM extractor would output: the list (list gold) or the last number of the
    reply's `<answer>` tag, else of its final answer; None when there is none."""
    if not text:
        return None
    answer, _ = split_reasoning(text)
    tags = _ANSWER_TAG.findall(answer) or _ANSWER_TAG.findall(text)
    span = tags[-1] if tags else final_answer_span(text)
    if span is None:
        return None
    if kind == "list":
        found = _LIST.findall(span)
        return found[-1] if found else None
    numbers = _NUMBER.findall(span)
    return numbers[-1].replace(",", "") if numbers else None


def _numeric_right(parsed: str | None, answer: str, approx: bool) -> bool:
    kind, gold = _gold_kind(answer)
    if parsed is None or kind == "str":
        return False
    try:
        pred = {"int": int, "float": float, "list": ast.literal_eval}[kind](parsed)
    except (ValueError, SyntaxError, TypeError):
        return False
    if pred == gold:
        return True
    if not approx or kind == "list" or pred == 0 or gold == 0:
        return False  # the official ratio would divide by zero; only equality can count
    return min(pred / gold, gold / pred) >= APPROX_RATE


def answer_correct(item: Item, reply: str | None) -> bool:
    qtype = item.extra["question_type"]
    if qtype == "multi_choice":
        choice = extract_choice(reply, item.options)
        return choice is not None and choice.lower() == item.answer.lower()
    kind, _ = _gold_kind(item.answer)
    return _numeric_right(reply_number(reply, kind), item.answer, approx=qtype == "approx")


def correct(item: Item, prediction: Prediction) -> bool:
    """The official extractor's verdict when the prediction carries one, else our reading of the reply."""
    verdict = verdict_of(prediction)
    return bool(verdict) if verdict is not None else answer_correct(item, reply_text(prediction))


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.pstdev(values)


def lhs_of(scores: Sequence[Sequence[float]]) -> float | None:
    """An item's LHS from its judge × reference score lists (five numbers each); None without any."""
    means = [statistics.fmean(s) for s in scores if len(s) == len(DIMENSIONS)]
    return statistics.fmean(means) if means else None


def _accuracy(rows: Sequence[bool]) -> dict[str, Any]:
    return {"total": len(rows), "correct": sum(rows), "accuracy": ratio(sum(rows), len(rows))}


def score(items: Sequence[Item], predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    by_class: dict[str, list[bool]] = {c: [] for c in CLASSES}
    by_type: dict[str, list[bool]] = defaultdict(list)
    units: dict[str, list[float]] = defaultdict(list)
    lhs: list[float] = []
    right_total = []
    for item in items:
        prediction = predictions.get(item.id)
        right = correct(item, prediction)
        right_total.append(right)
        by_class[item.extra["classification"]].append(right)
        by_type[item.extra["question_type"]].append(right)
        if isinstance(prediction, Mapping):
            for unit in ("claim", "step"):
                if (match := prediction.get(f"{unit}_match")) is not None:
                    for name, value in zip(("precision", "recall", "f1"), prf(match), strict=True):
                        units[f"{unit}_{name}"].append(value)
            if (value := lhs_of(prediction.get("lhs_scores") or ())) is not None:
                lhs.append(value)
    lhs_mean, lhs_std = _mean_std(lhs)
    return {
        "questions": len(items),
        "accuracy": ratio(sum(right_total), len(items)),
        "by_class": {c: _accuracy(v) for c, v in by_class.items()},
        "by_question_type": {t: _accuracy(v) for t, v in sorted(by_type.items())},
        **{
            f"{u}_{m}": statistics.fmean(units[f"{u}_{m}"]) if units[f"{u}_{m}"] else None
            for u in ("claim", "step")
            for m in ("precision", "recall", "f1")
        },  # fmt: skip
        "claim_judged": len(units["claim_f1"]),
        "step_judged": len(units["step_f1"]),
        "lhs_mean": lhs_mean,
        "lhs_std": lhs_std,
        "lhs_judged": len(lhs),
        "judge_dependent": [
            *(f"{u}_{m}" for u in ("claim", "step") for m in ("precision", "recall", "f1")),
            "lhs_mean",
            "lhs_std",
        ],  # fmt: skip
    }


# --------------------------------------------------------------------------------------------- judging


def prf(match: Mapping[str, Sequence[str]]) -> tuple[float, float, float]:
    """The official `calculate_metrics`: precision = (MATCH + REASONABLE) / predicted, recall = MATCH /
    reference (0 over an empty list), F1 of the two (0 when both are 0)."""
    pred, gt = match.get("pred") or [], match.get("gt") or []
    precision = sum(m in ("MATCH", "REASONABLE") for m in pred) / len(pred) if pred else 0.0
    recall = sum(m == "MATCH" for m in gt) / len(gt) if gt else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return precision, recall, f1


_PRED_MATCH = re.compile(r"pred_match(.*?)/pred_match", re.S)
_GT_MATCH = re.compile(r"gt_match(.*?)/gt_match", re.S)


def parse_match(text: str) -> dict[str, list[str]] | None:
    """The judge's label lists, as the official `extract_pred_match` / `extract_gt_match` read them;
    None when either block is missing (the official script would fail there)."""
    pred, gt = _PRED_MATCH.findall(text), _GT_MATCH.findall(text)
    if not pred or not gt:
        return None
    return {
        "pred": re.findall(r"\b(MATCH|REASONABLE|CONFLICT)\b", pred[0]),
        "gt": re.findall(r"\b(MATCH|CONFLICT)\b", gt[0]),
    }


def parse_lhs(text: str) -> list[float] | None:
    """The five dimension scores (clamped to 1-5) in DIMENSIONS order from the judge's JSON; None if any
    is missing."""
    scores = []
    for name in DIMENSIONS:
        found = re.findall(rf'"{name}"\s*:\s*\{{\s*"score"\s*:\s*(\d+(?:\.\d+)?)', text, re.I)
        found = found or re.findall(rf"{name}\W*:\s*\**\s*(\d+(?:\.\d+)?)", text, re.I)
        if not found:
            return None
        scores.append(min(5.0, max(1.0, float(found[-1]))))
    return scores


MATCH_SYSTEM = "You compare a model's reasoning with a reference solution, unit by unit, and label every unit."
MATCH_TEMPLATE = """{question_kind}{question}

Model's reasoning:
{chain}

Reference {unit}s (or, when not split yet, the reference reasoning to split into {unit}s):
{reference}

First split the model's reasoning into atomic {unit}s (one conclusion or one observation each). Then label
each of the model's {unit}s MATCH (agrees with a reference {unit}), REASONABLE (not in the reference but valid
and not contradicting it) or CONFLICT (contradicts the reference), and each reference {unit} MATCH (covered by
some model {unit}) or CONFLICT (not covered). If the final answers differ, do not call units REASONABLE lightly.
Output, in this format and order:
<pred_match>MATCH,REASONABLE,CONFLICT,...</pred_match>
<gt_match>MATCH,CONFLICT,...</gt_match>"""

LHS_SYSTEM = "You evaluate a model's chain of thought against a reference chain of thought, strictly."
LHS_TEMPLATE = """Problem:
{question}

Model's chain of thought:
{chain}

Reference chain of thought:
{reference}

Score the model's chain on each dimension from 1 (worst) to 5 (best); keep high scores for flawless or
near-flawless reasoning and look hard at chains whose final answer differs from the reference's:
factual accuracy (facts, definitions, formulas), logical consistency (each step follows), reasoning
completeness (no key step missing), conceptual reasoning accuracy (the right concepts, rightly used),
strategy appropriateness (a valid, suitable approach). Answer with this JSON only:
{{"Factual Accuracy": {{"score": X}}, "Logical Consistency": {{"score": X}}, "Reasoning Completeness": {{"score": X}},
"Conceptual Reasoning Accuracy": {{"score": X}}, "Strategy Appropriateness": {{"score": X}}}}"""

_QUESTION_KIND = {
    "multi_choice": "Here is a multiple choice question: ",
    "approx": "Here is a free-form question; the answer may be approximately right within 5% error: ",
}
_EXACT = "Here is a free-form question; the answer must be exact: "


def _chain_of(prediction: Prediction) -> str:
    text = reply_text(prediction) or ""
    answer, reasoning = split_reasoning(text)
    return (f"{reasoning}\n{answer}" if reasoning else answer).strip() or "(empty)"


def _units(reference: str, unit: str) -> str:
    tagged = re.findall(rf"<{unit}>(.*?)</{unit}>", reference, re.S)
    return "\n".join(f"<{unit}>{t.strip()}</{unit}>" for t in tagged)


async def judge(
    items: Sequence[Item],
    predictions: Mapping[str, Prediction],
    backend: JudgeBackend | Sequence[JudgeBackend],
    *,
    concurrency: int = 4,
) -> dict[str, dict[str, Any]]:
    """Claim and step matches (first judge) and LHS scores (every judge × every reference chain) for each
    answered item: `{id: {"claim_match", "step_match", "lhs_scores", "judge_errors"}}`."""
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
        out: dict[str, Any] = {"claim_match": None, "step_match": None, "lhs_scores": [], "judge_errors": 0}
        if not refs:
            return item.id, out
        kind = _QUESTION_KIND.get(item.extra["question_type"], _EXACT)
        matches = {
            unit: ask(backends[0], MATCH_SYSTEM, MATCH_TEMPLATE.format(
                question_kind=kind, question=item.question, chain=chain, unit=unit,
                reference=_units(item.extra["reference_units"], unit) or refs[0]))
            for unit in ("claim", "step")
        }  # fmt: skip
        lhs_calls = [
            ask(b, LHS_SYSTEM, LHS_TEMPLATE.format(question=item.question, chain=chain, reference=ref))
            for b in backends
            for ref in refs
        ]
        replies = await asyncio.gather(*matches.values(), *lhs_calls)
        for unit, reply in zip(matches, replies[: len(matches)], strict=True):
            out[f"{unit}_match"] = parse_match(reply) if reply else None
            out["judge_errors"] += out[f"{unit}_match"] is None
        for reply in replies[len(matches) :]:
            parsed = parse_lhs(reply) if reply else None
            if parsed is None:
                out["judge_errors"] += 1
            else:
                out["lhs_scores"].append(parsed)
        return item.id, out

    todo = [i for i in items if predictions.get(i.id) is not None]
    return dict(await asyncio.gather(*(one(i) for i in todo)))


def from_official(records: Sequence[Mapping[str, Any]], items: Sequence[Item]) -> dict[str, Prediction] | None:
    """Predictions from the official evaluation table (mirage.tsv's rows with a `response` column;
    a `sign` column, the official extractor's verdict, is kept as `verdict`). JSON records or a TSV."""
    if not records or not all(isinstance(r, Mapping) and "response" in r for r in records):
        return None
    out: dict[str, Prediction] = {}
    for n, record in enumerate(records):
        item_id = f"mirage-{as_text(record.get('index')).strip() or n}"
        prediction: dict[str, Any] = {"id": item_id, "text": as_text(record["response"])}
        if as_text(record.get("sign")).strip() in ("0", "1", "0.0", "1.0"):
            prediction["verdict"] = float(as_text(record["sign"])) == 1
        out[item_id] = prediction
    return out
