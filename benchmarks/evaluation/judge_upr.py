"""The evaluation judge of the paper's Algorithm 1: a judge VLM labels whole chains, for UPR.

Unlike the detector prompt used during generation (detectors/judge_prompt.py, partial chain, first
unfaithful sentence only), the evaluation judge sees the finished chain and labels every sentence. The
prompt keeps the structure of the paper's Table 14 in our own words: the question, the image (as an
image part beside the text), the chain as numbered sentences; the judge first describes the image
(grounding raised agreement with human annotators), then writes one block per sentence:

    Sentence k: "<the sentence>"
    Type: PERCEPTION | REASONING
    Faithfulness: FAITHFUL | UNFAITHFUL        (perception sentences only)

No rationales are asked for: they lowered agreement with humans.

`parse_evaluation_reply` is lenient about markdown, case, quotes and labels on one line, but never
invents a label: a sentence the reply does not cover, or a perception sentence without a
faithfulness verdict, stays unlabelled (null) and is counted. A reply with no sentence block at all is
"unparseable": the chain keeps no labels and the error is recorded on it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.labelled import PERCEPTION, REASONING, LabelledChain, LabelledStep
from faithproxy.benchmarks.evaluation.metrics import upr
from faithproxy.benchmarks.evaluation.replay import ImageResolver
from faithproxy.clients.judge_base import JudgeBackend
from faithproxy.faithcore.errors import DetectorError

EVALUATION_SYSTEM_PROMPT = (
    "You grade step-by-step answers about images. You check each statement an answer makes about the "
    "image against what the image really shows."
)

_QUESTION_HEADER = "Question:"
_CHAIN_HEADER = "The answer to grade, one numbered sentence per line:"
_INSTRUCTIONS = """\
What to do:
1. Look at the image first and describe it in one or two sentences.
2. Go through the sentences in order. Give each a Type: PERCEPTION when it states something about \
the image (objects, attributes, counts, positions, text), REASONING when it infers, calculates, plans \
or uses general knowledge.
3. For a PERCEPTION sentence only, add its Faithfulness: FAITHFUL when the image supports it, \
UNFAITHFUL when it misdescribes the image.
4. Do not explain your labels.

Answer in exactly this layout:
Image description: <one or two sentences>
Sentence 1: "<sentence 1>"
Type: PERCEPTION or REASONING
Faithfulness: FAITHFUL or UNFAITHFUL   (leave this line out for REASONING)
and the same block for every following sentence."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def build_evaluation_prompt(question: str, sentences: Sequence[str]) -> str:
    """The user turn of an evaluation call; the image travels beside it as an image part."""
    lines = [_QUESTION_HEADER, question.strip(), "", _CHAIN_HEADER]
    lines += [f"Sentence {i}: {_one_line(s)}" for i, s in enumerate(sentences, start=1)]
    lines += ["", _INSTRUCTIONS]
    return "\n".join(lines)


_PROMPT_SENTENCE = re.compile(r"^Sentence (\d+): (.*)$")


def parse_evaluation_prompt(text: str) -> tuple[str, list[str]]:
    """(question, sentences) back from `build_evaluation_prompt`; ValueError for any other text.
    Local test judges use it to play an oracle."""
    if not text.startswith(_QUESTION_HEADER + "\n"):
        raise ValueError("not an evaluation prompt: no question header")
    question, sep, rest = text[len(_QUESTION_HEADER) + 1 :].partition("\n\n" + _CHAIN_HEADER + "\n")
    if not sep:
        raise ValueError("not an evaluation prompt: no chain header")
    sentences = []
    for line in rest.split("\n"):
        match = _PROMPT_SENTENCE.match(line)
        if match is None or int(match.group(1)) != len(sentences) + 1:
            break
        sentences.append(match.group(2))
    return question, sentences


# ---------------------------------------------------------------------------------------------- reply


@dataclass(frozen=True)
class SentenceLabel:
    kind: str | None  # "perception" | "reasoning" | None (not covered by the reply)
    faithful: bool | None


@dataclass(frozen=True)
class EvaluationReply:
    labels: list[SentenceLabel]
    description: str | None
    missing: int  # sentences the reply has no block for
    unlabelled_perception: int  # perception sentences without a faithfulness verdict


_MARKUP = re.compile(r"\*\*|__|`|^#+\s*")
_BLOCK_HEADER = re.compile(r"^\s*[-*>]?\s*\[?\s*sentence\s*(\d+)\s*\]?\s*[:.)\-]?\s*(.*)$", re.IGNORECASE)
_TYPE_FIELD = re.compile(r"\btype\s*[:=\-]\s*\W*(perception|reasoning)\b", re.IGNORECASE)
_FAITH_FIELD = re.compile(r"\bfaithful(?:ness)?\s*[:=\-]\s*\W*(un\s*faithful|not\s+faithful|faithful)\b", re.IGNORECASE)
_TYPE_WORD = re.compile(r"\b(PERCEPTION|REASONING)\b")
_FAITH_WORD = re.compile(r"\b(UNFAITHFUL|FAITHFUL)\b")
_QUOTED = re.compile(r"^\s*[\"\u201c'](.*)[\"\u201d']")
_DESCRIPTION = re.compile(r"^\s*\[?\s*(?:image\s+)?description\s*\]?\s*[:\-]\s*(.*)$", re.IGNORECASE)


def _strip_quoted(text: str) -> str:
    """A block header's remainder without the quoted sentence, which may contain any words at all."""
    match = _QUOTED.match(text)
    return text[match.end() :] if match else text


def _unfaithful(value: str) -> bool:
    return "".join(value.split()).upper() != "FAITHFUL"


def parse_evaluation_reply(reply: str, n_sentences: int) -> EvaluationReply:
    """Labels for sentences 1..n from an evaluation reply; DetectorError(code="unparseable") if it
    contains no sentence block at all."""
    blocks: dict[int, list[str]] = {}
    current: int | None = None
    preamble: list[str] = []
    for raw in reply.splitlines():
        line = _MARKUP.sub("", raw).strip()
        header = _BLOCK_HEADER.match(line)
        if header is not None:
            current = int(header.group(1))
            blocks.setdefault(current, []).append(_strip_quoted(header.group(2)))
            continue
        if current is None:
            if line:
                preamble.append(line)
        else:
            blocks[current].append(line)
    if not any(1 <= k <= n_sentences for k in blocks):
        raise DetectorError("evaluation reply unparseable: no sentence block", code="unparseable")
    labels = []
    for k in range(1, n_sentences + 1):
        if k not in blocks:
            labels.append(SentenceLabel(None, None))
            continue
        body = "\n".join(blocks[k])
        typed = _TYPE_FIELD.search(body) or _TYPE_WORD.search(body)
        judged = _FAITH_FIELD.search(body) or _FAITH_WORD.search(body)
        kind = typed.group(1).lower() if typed else None
        faithful = None if judged is None else not _unfaithful(judged.group(1))
        if kind is None and judged is not None:
            kind = PERCEPTION  # only perception sentences carry a verdict
        if kind == REASONING:
            faithful = None
        labels.append(SentenceLabel(kind, faithful))
    description = None
    for line in preamble:
        match = _DESCRIPTION.match(line)
        if match:
            description = match.group(1).strip() or None
            break
    if description is None and preamble:
        description = " ".join(preamble)
    return EvaluationReply(
        labels=labels,
        description=description,
        missing=sum(1 for k in range(1, n_sentences + 1) if k not in blocks),
        unlabelled_perception=sum(1 for label in labels if label.kind == PERCEPTION and label.faithful is None),
    )


# ------------------------------------------------------------------------------------------ labelling


@dataclass
class JudgeUPRReport:
    judge: str
    model: str
    chains: int
    judge_calls: int
    input_tokens: int
    output_tokens: int
    latency_mean_s: float | None
    wall_s: float
    errors: int  # calls that failed or replies that could not be parsed
    missing_sentences: int
    unlabelled_perception: int
    upr: dict[str, Any]  # benchmarks.metrics.UPRResult.to_dict() over the judge's labels
    error_messages: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def label_chain(
    chain: LabelledChain, backend: JudgeBackend, images: ImageResolver | None = None
) -> tuple[LabelledChain, dict[str, Any]]:
    """The chain labelled by the judge (same texts, the judge's kinds and verdicts; the record's other
    fields kept) and the call's record."""
    sentences = [s.text for s in chain.steps]
    info: dict[str, Any] = {"judge": backend.name, "model": backend.model}
    labelled = LabelledChain(chain.id, chain.question, image=chain.image, answer=chain.answer,
                             gold_answer=chain.gold_answer)  # fmt: skip
    labelled.steps = [LabelledStep(s.text) for s in chain.steps]
    labelled.extra = {**chain.extra, "judge_upr": info}  # the record's own fields (e.g. "correct") stay
    if not sentences:
        return labelled, info
    image = (images or ImageResolver()).resolve(chain.image)
    info["image_sent"] = image is not None
    try:
        result = await backend.complete(
            EVALUATION_SYSTEM_PROMPT, build_evaluation_prompt(chain.question, sentences), [image] if image else []
        )
    except DetectorError as exc:
        info["error"] = exc.message
        return labelled, info
    info.update(input_tokens=result.input_tokens, output_tokens=result.output_tokens, latency_s=result.latency_s)
    try:
        reply = parse_evaluation_reply(result.text, len(sentences))
    except DetectorError as exc:
        info["error"] = exc.message
        return labelled, info
    info.update(description=reply.description, missing=reply.missing,
                unlabelled_perception=reply.unlabelled_perception)  # fmt: skip
    for step, label in zip(labelled.steps, reply.labels, strict=True):
        step.kind, step.faithful = label.kind, label.faithful
    return labelled, info


async def judge_upr(
    chains: Sequence[LabelledChain],
    backend: JudgeBackend,
    *,
    image_dir: str | Path | None = None,
    concurrency: int = 4,
    progress: bool = True,
) -> tuple[list[LabelledChain], JudgeUPRReport]:
    """Every chain labelled by the evaluation judge (same order), and UPR over those labels."""
    from tqdm.auto import tqdm

    images = ImageResolver(image_dir)
    gate = asyncio.Semaphore(max(1, concurrency))
    bar = tqdm(total=len(chains), desc=f"judge-upr {backend.name}", unit="chain", disable=not progress, leave=False)
    started = time.perf_counter()

    async def one(chain: LabelledChain) -> tuple[LabelledChain, dict[str, Any]]:
        async with gate:
            out = await label_chain(chain, backend, images)
        bar.update(1)
        return out

    try:
        results = await asyncio.gather(*(one(c) for c in chains))
    finally:
        bar.close()
    labelled = [c for c, _ in results]
    infos = [i for _, i in results]
    called = [i for i in infos if "image_sent" in i]
    latencies = [i["latency_s"] for i in infos if "latency_s" in i]
    report = JudgeUPRReport(
        judge=backend.name,
        model=backend.model,
        chains=len(chains),
        judge_calls=len(called),
        input_tokens=sum(i.get("input_tokens", 0) for i in infos),
        output_tokens=sum(i.get("output_tokens", 0) for i in infos),
        latency_mean_s=sum(latencies) / len(latencies) if latencies else None,
        wall_s=time.perf_counter() - started,
        errors=sum(1 for i in infos if "error" in i),
        missing_sentences=sum(i.get("missing", 0) for i in infos),
        unlabelled_perception=sum(i.get("unlabelled_perception", 0) for i in infos),
        upr=upr(labelled).to_dict(),
        error_messages=sorted({i["error"] for i in infos if "error" in i})[:10],
    )
    return labelled, report
