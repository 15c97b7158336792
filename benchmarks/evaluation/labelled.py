"""The labelled-chain format: one JSON object per line, used by every offline tool of `faithproxy bench`.

    {"id": "c1",                        # unique within a file
     "question": "What colour ...?",    # the text the model answered
     "image": "a.png" | "<sha256>" | null,
     "steps": [{"text": "The car is red.",
                "kind": "perception" | "reasoning" | null,
                "faithful": true | false | null,    # null: no label (reasoning steps, unchecked steps)
                "score": 0.93}],                   # optional: P(unfaithful), on predictions
     "answer": "B" | null,
     "gold_answer": "B" | null}

Gold files carry labels from ground truth or a strong judge; prediction files (`bench replay`) carry a
detector's labels and, when it has them, scores. Faithfulness is defined only for perception steps:
metrics count a step's label only when its kind is not "reasoning".

Fields the format does not name are kept, on the record and on each step, and written back unchanged:
a record converted from a proxy trace keeps every trace field, so the conversion loses nothing
(`benchmarks/evaluation/from_traces.py`). Reading validates each line and names the file, the line and the field
of the first problem (`LabelledFormatError`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from faithproxy.faithcore.errors import BenchmarkError

PERCEPTION = "perception"
REASONING = "reasoning"
KINDS = (PERCEPTION, REASONING)

_RECORD_FIELDS = ("id", "question", "image", "steps", "answer", "gold_answer")
_STEP_FIELDS = ("text", "kind", "faithful", "score")


class LabelledFormatError(BenchmarkError):
    """A labelled-chain file or record that does not follow the format; the message says where."""


@dataclass
class LabelledStep:
    text: str
    kind: str | None = None
    faithful: bool | None = None
    score: float | None = None  # P(unfaithful), predictions only
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_perception(self) -> bool:
        return self.kind == PERCEPTION

    @property
    def labelled(self) -> bool:
        """Whether this step has a faithfulness label that metrics count (never on reasoning steps)."""
        return self.faithful is not None and self.kind != REASONING

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "kind": self.kind, "faithful": self.faithful}
        if self.score is not None:
            out["score"] = self.score
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


@dataclass
class LabelledChain:
    id: str
    question: str
    steps: list[LabelledStep] = field(default_factory=list)
    image: str | None = None
    answer: str | None = None
    gold_answer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def perception_steps(self) -> int:
        return sum(1 for s in self.steps if s.is_perception)

    @property
    def unfaithful_steps(self) -> int:
        """Perception steps labelled unfaithful (the numerator of UPR)."""
        return sum(1 for s in self.steps if s.is_perception and s.faithful is False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "image": self.image,
            "steps": [s.to_dict() for s in self.steps],
            "answer": self.answer,
            "gold_answer": self.gold_answer,
        }
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


# ------------------------------------------------------------------------------------------ parsing


def _optional_str(obj: dict[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise LabelledFormatError(f"{where}: {key!r} must be a string or null, not {type(value).__name__}")
    return value


def step_from_dict(obj: Any, where: str = "step") -> LabelledStep:
    if not isinstance(obj, dict):
        raise LabelledFormatError(f"{where}: a step must be a JSON object, not {type(obj).__name__}")
    text = obj.get("text")
    if not isinstance(text, str):
        raise LabelledFormatError(f"{where}: 'text' is required and must be a string")
    kind = obj.get("kind")
    if kind is not None and kind not in KINDS:
        raise LabelledFormatError(f"{where}: 'kind' must be 'perception', 'reasoning' or null, not {kind!r}")
    faithful = obj.get("faithful")
    if faithful is not None and not isinstance(faithful, bool):
        raise LabelledFormatError(f"{where}: 'faithful' must be true, false or null, not {faithful!r}")
    score = obj.get("score")
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise LabelledFormatError(f"{where}: 'score' must be a finite number or absent, not {score!r}")
        score = float(score)
    extra = {k: v for k, v in obj.items() if k not in _STEP_FIELDS}
    return LabelledStep(text, kind, faithful, score, extra)


def chain_from_dict(obj: Any, where: str = "record") -> LabelledChain:
    if not isinstance(obj, dict):
        raise LabelledFormatError(f"{where}: a record must be a JSON object, not {type(obj).__name__}")
    chain_id = obj.get("id")
    if isinstance(chain_id, bool) or not isinstance(chain_id, str | int) or chain_id == "":
        raise LabelledFormatError(f"{where}: 'id' is required and must be a non-empty string")
    where = f"{where} (id {chain_id!r})"
    question = obj.get("question")
    if question is None:
        question = ""
    if not isinstance(question, str):
        raise LabelledFormatError(f"{where}: 'question' must be a string")
    steps = obj.get("steps")
    if not isinstance(steps, list):
        raise LabelledFormatError(f"{where}: 'steps' is required and must be a list")
    parsed = [step_from_dict(s, f"{where}, step {i}") for i, s in enumerate(steps)]
    extra = {k: v for k, v in obj.items() if k not in _RECORD_FIELDS}
    return LabelledChain(
        id=str(chain_id),
        question=question,
        steps=parsed,
        image=_optional_str(obj, "image", where),
        answer=_optional_str(obj, "answer", where),
        gold_answer=_optional_str(obj, "gold_answer", where),
        extra=extra,
    )


def iter_chains(lines: Iterable[str], source: str = "<input>") -> Iterator[LabelledChain]:
    """Chains from JSONL lines (blank lines skipped); a repeated id is an error."""
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LabelledFormatError(f"{where}: not valid JSON ({exc.msg})") from exc
        chain = chain_from_dict(obj, where)
        if chain.id in seen:
            raise LabelledFormatError(f"{where}: id {chain.id!r} appears twice")
        seen.add(chain.id)
        yield chain


def read_chains(path: str | Path) -> list[LabelledChain]:
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as handle:
            return list(iter_chains(handle, str(path)))
    except FileNotFoundError as exc:
        raise LabelledFormatError(f"{path}: no such file") from exc


def dump_chain(chain: LabelledChain) -> str:
    return json.dumps(chain.to_dict(), ensure_ascii=False)


def write_chains(path_or_handle: str | Path | TextIO, chains: Iterable[LabelledChain]) -> int:
    """Writes one line per chain (a path is overwritten); returns the number written."""
    if isinstance(path_or_handle, str | Path):
        with Path(path_or_handle).open("w", encoding="utf-8") as handle:
            return write_chains(handle, chains)
    written = 0
    for chain in chains:
        path_or_handle.write(dump_chain(chain) + "\n")
        written += 1
    return written
