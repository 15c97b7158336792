"""Corrected steps as preference pairs in TRL's format for vision-language DPO.

One pair per corrected step (flagged, then rewritten until the detector passed the rewrite):

    {"prompt":   [{"role": "user", "content": [{"type": "image"}, ..., {"type": "text", "text": QUESTION}]}],
     "chosen":   [{"role": "assistant", "content": PREFIX + REWRITE}],
     "rejected": [{"role": "assistant", "content": PREFIX + FLAGGED}],
     "images":   [data URL or file path, one per placeholder],
     "metadata": {request id, model, detector, judge, verdicts, confidence, retries, ...}}

PREFIX is the chain up to the step (what the client received before it, in its channel). It opens both
completions rather than closing the prompt: TRL renders a prompt whose last turn is the assistant's by
closing that turn and opening a new one for the completion, so a partial chain there would turn into a
finished reply. In DPO's loss the shared prefix cancels (its log-probabilities are the same under both
completions), so the pair still compares the two steps; `metadata.prefix`, `.chosen_step` and
`.rejected_step` give the parts for trainers that mask to the step (flywheel/dpo.py does).

The prompt is rebuilt from what the proxy records: the last user message's text and its images
(placeholders first, as an OpenAI request puts image parts before the text). Other turns (a system
message, earlier exchanges) are not recorded by the proxy, so they are not in the pair.

Filters (`ExportOptions`): a minimum detector confidence on the flag; residual steps (no rewrite
passed) never make a pair; duplicates (same images, question, prefix and both steps) are dropped; a
share of the images goes to a held-out split, decided by the images' hashes so that every pair of one
image lands on the same side.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faithproxy.flywheel.images import ImageIndex
from faithproxy.flywheel.records import Recorded, RecordedStep

TRAIN, HELDOUT = "train", "heldout"


@dataclass(frozen=True)
class ExportOptions:
    """`min_confidence`: leave out flags the detector was less sure of (and flags without a confidence).
    `heldout_fraction`: the share of images whose pairs go to the held-out split."""

    min_confidence: float | None = None
    heldout_fraction: float = 0.0
    dedupe: bool = True
    split_salt: str = "faithproxy-flywheel"


@dataclass
class Export:
    """The pairs by split and what was left out, by reason."""

    pairs: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {TRAIN: [], HELDOUT: []})
    counts: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        return {"pairs": {split: len(rows) for split, rows in self.pairs.items()}, "counts": dict(self.counts)}


def split_of(image_hashes: Iterable[str], fraction: float, salt: str) -> str:
    """Held out or not, from the images alone: a pair's side never depends on its text."""
    if fraction <= 0:
        return TRAIN
    digest = hashlib.sha256((salt + ":" + ",".join(image_hashes)).encode()).digest()
    return HELDOUT if int.from_bytes(digest[:8], "big") / 2**64 < fraction else TRAIN


def prefix_before(recorded: Recorded, step: RecordedStep) -> str:
    """The chain up to `step`, as delivered: cut from the channel's delivered text where the record keeps
    it (so spacing and tags such as `<think>` are the model's), else the earlier steps joined by spaces."""
    earlier = [s for s in recorded.steps if s.channel == step.channel and s.index < step.index]
    text = recorded.texts.get(step.channel)
    if text is not None:
        at = 0
        for s in earlier:
            found = text.find(s.text, at)
            if found < 0:
                break
            at = found + len(s.text)
        else:
            found = text.find(step.text, at)
            if found >= 0:
                return text[:found]
    return "".join(s.text + " " for s in earlier)


def pair_row(recorded: Recorded, step: RecordedStep, images: list[str], split: str) -> dict[str, Any]:
    """The TRL row of one corrected step."""
    assert step.original_text is not None
    prefix = prefix_before(recorded, step)
    user = [*({"type": "image"} for _ in images), {"type": "text", "text": recorded.question or ""}]
    return {
        "prompt": [{"role": "user", "content": user}],
        "chosen": [{"role": "assistant", "content": prefix + step.text}],
        "rejected": [{"role": "assistant", "content": prefix + step.original_text}],
        "images": images,
        "metadata": {
            "request_id": recorded.request_id,
            "model": recorded.model,
            "detector": recorded.detector,
            "judge": recorded.judge,
            "step_index": step.index,
            "channel": step.channel,
            "kind": step.kind,
            "detected": step.detected,  # the verdict on the model's own step
            "verdict": step.verdict,  # the verdict on the rewrite that passed
            "confidence": step.confidence,
            "reason": step.reason,
            "retries": step.attempts,
            "rejected_rewrites": list(step.rejected),
            "image_sha256": list(recorded.image_hashes),
            "source": recorded.source,
            "split": split,
            "prefix": prefix,
            "chosen_step": step.text,
            "rejected_step": step.original_text,
        },
    }


def _dedupe_key(recorded: Recorded, step: RecordedStep) -> tuple[Any, ...]:
    prefix = prefix_before(recorded, step)
    return (recorded.image_hashes, recorded.question, prefix, step.original_text, step.text)


def export_pairs(requests: Iterable[Recorded], images: ImageIndex, options: ExportOptions) -> Export:
    """Every corrected step of `requests` that passes the filters, as a TRL row in its split."""
    out = Export()
    seen: set[tuple[Any, ...]] = set()
    for recorded in requests:
        out.counts["requests"] += 1
        for step in recorded.steps:
            if step.residual:  # no rewrite passed: nothing to prefer
                out.counts["left_out_residual"] += 1
                continue
            if step.original_text is None:
                continue
            out.counts["rewritten"] += 1
            if not step.corrected:  # a rewrite delivered without a passing verdict
                out.counts["left_out_unverified"] += 1
                continue
            if options.min_confidence is not None and (
                step.confidence is None or step.confidence < options.min_confidence
            ):
                out.counts["left_out_confidence"] += 1
                continue
            key = _dedupe_key(recorded, step)
            if options.dedupe and key in seen:
                out.counts["left_out_duplicate"] += 1
                continue
            resolved = images.resolve(recorded)
            if resolved is None:
                out.counts["left_out_image_not_at_hand"] += 1
                continue
            seen.add(key)
            split = split_of(recorded.image_hashes, options.heldout_fraction, options.split_salt)
            out.pairs[split].append(pair_row(recorded, step, resolved, split))
    return out


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)
