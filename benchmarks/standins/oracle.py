"""What the judge stand-in judges by, and the replies it writes.

A verdict source has `verdicts(sentences, images) -> (description, kinds, unfaithful)`: an `Oracle`
(ground truth known in advance, below) or the ShapesWorld pixel judge
(faithproxy.benchmarks.shapesworld.pixel_judge). `format_reply` writes the judge format of
detectors/judge_prompt.py; `format_evaluation` the whole-chain evaluation format of `faithproxy bench
judge-upr`.

Oracle file (JSON):

    {"unfaithful": ["The man wears a red scarf.", ...],   # unfaithful iff the normalised text is listed
     "reasoning": ["So the answer is B.", ...],            # optional: typed REASONING
     "perception": ["..."],                                # optional: typed PERCEPTION
     "description": "A man in a red hat."}                 # optional: the image description to reply

Sentences in neither list are typed by the rules of the proxy's step typer (faithproxy.faithcore.kinds:
deductions, plans, the task, general knowledge are REASONING) and its arithmetic cue
(faithproxy.faithcore.step_features), and are PERCEPTION otherwise, as a judge that would rather check a
sentence than miss one; listed unfaithful sentences are always PERCEPTION. Texts are compared
normalised: lower case, single spaces, without surrounding quotes and final punctuation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from faithproxy.faithcore.kinds import rule_kind
from faithproxy.faithcore.step_features import CUES
from faithproxy.faithcore.types import StepKind


class Verdicts(Protocol):
    def verdicts(self, sentences: list[str], images: list[bytes]) -> tuple[str, list[StepKind], list[bool]]: ...


def normalise(text: str) -> str:
    return " ".join(text.split()).strip(" \"'“”‘’.!?").lower()


@dataclass(frozen=True)
class Oracle:
    """The ground truth the server judges by."""

    unfaithful: frozenset[str] = frozenset()
    reasoning: frozenset[str] = frozenset()
    perception: frozenset[str] = frozenset()
    description: str = "An image used for local testing."

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Oracle:
        def texts(key: str) -> frozenset[str]:
            return frozenset(normalise(t) for t in data.get(key, ()) if isinstance(t, str))

        return cls(
            texts("unfaithful"),
            texts("reasoning"),
            texts("perception"),
            str(data.get("description") or cls.description),
        )

    @classmethod
    def load(cls, path: str | Path) -> Oracle:
        return cls.from_mapping(json.loads(Path(path).read_text(encoding="utf-8")))

    @classmethod
    def of(cls, unfaithful: Iterable[str] = (), **lists: Any) -> Oracle:
        return cls.from_mapping({"unfaithful": list(unfaithful), **lists})

    def is_unfaithful(self, sentence: str) -> bool:
        return normalise(sentence) in self.unfaithful

    def kind(self, sentence: str) -> StepKind:
        text = normalise(sentence)
        if text in self.unfaithful or text in self.perception:
            return StepKind.PERCEPTION
        if text in self.reasoning or rule_kind(sentence) is StepKind.REASONING or CUES["arithmetic"].search(sentence):
            return StepKind.REASONING
        return StepKind.PERCEPTION

    def reply(self, sentences: list[str], already_checked: int = 0, *, describe: bool = True) -> str:
        """The judge-format reply an obedient, perfect judge would give."""
        return format_reply(*self.verdicts(sentences, []), sentences, already_checked, describe=describe)

    def verdicts(self, sentences: list[str], images: list[bytes]) -> tuple[str, list[StepKind], list[bool]]:
        """(image description, kind of each sentence, whether each is an unfaithful perception)."""
        kinds = [self.kind(s) for s in sentences]
        unfaithful = [k is StepKind.PERCEPTION and self.is_unfaithful(s) for k, s in zip(kinds, sentences, strict=True)]
        return self.description, kinds, unfaithful


def format_evaluation(description: str, kinds: list[StepKind], unfaithful: list[bool], sentences: list[str]) -> str:
    """The reply to the evaluation prompt of `faithproxy bench judge-upr` (benchmarks/evaluation/judge_upr.py): a
    block per sentence, every sentence labelled."""
    lines = [f"Image description: {description}"]
    for i, (sentence, kind, wrong) in enumerate(zip(sentences, kinds, unfaithful, strict=True), start=1):
        lines += [f'Sentence {i}: "{sentence}"', f"Type: {kind.name}"]
        if kind is StepKind.PERCEPTION:
            lines.append(f"Faithfulness: {'UNFAITHFUL' if wrong else 'FAITHFUL'}")
    return "\n".join(lines)


def format_reply(
    description: str,
    kinds: list[StepKind],
    unfaithful: list[bool],
    sentences: list[str],
    already_checked: int = 0,
    *,
    describe: bool = True,
) -> str:
    """Our judge reply format (detectors/judge_prompt.py): the description when asked for, a typing line
    for each sentence from `already_checked` on, the verdict, and the first unfaithful one by number.
    Sentences before `already_checked` are neither typed nor reported, as an obedient judge does with
    the context sentences."""
    first = next((i for i in range(already_checked, len(sentences)) if unfaithful[i]), None)
    lines = [f"[Image description]: {description}"] if describe else []
    lines += [f"Sentence {i}: {kinds[i - 1].name}" for i in range(already_checked + 1, len(sentences) + 1)]
    if first is None:
        lines.append("[Faithfulness]: FAITHFUL")
    else:
        lines += ["[Faithfulness]: UNFAITHFUL", f"[First unfaithful sentence]: {first + 1}"]
    return "\n".join(lines)
