"""How sure a judge is of its flag: P(UNFAITHFUL) for the flagged sentence, from the reply's tokens.

The judge replies `[Faithfulness]: FAITHFUL|UNFAITHFUL` then `[First unfaithful sentence]: <k>`
(judge_prompt.py). At the verdict's first token the server listed the likeliest tokens: those that
begin UNFAITHFUL (or NOT FAITHFUL) are one reading, those that begin FAITHFUL the other, and the
probability of the UNFAITHFUL reading is its share of the two (mass outside the listed tokens is not
known, so it is left out of both). A tokenizer that spells UNFAITHFUL as one token (the learned
ShapesWorld judge) and one that starts it with "UN" are read alike. When the reply names the sentence
by number, the number's own tokens multiply in: a judge that hesitates between sentences 2 and 3 is
less sure that sentence 2 is the unfaithful one. The result is None when the tokens do not show a
verdict (no log-probabilities, an unreadable layout): then the confidence is unknown, and thresholds
do not apply.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from faithproxy.clients.logprobs import TokenChoice

_VERDICT_AT = re.compile(r"faithfulness\s*\]?\s*[:=\-]?[\s*_`\"']*(?=\S)", re.IGNORECASE)
_NUMBER_AT = re.compile(
    r"first\s+unfaithful\s+sentence\s*\]?\s*[:=\-]?[\s*_`\"'#]*(?:sentence\s*)?(\d+)", re.IGNORECASE
)
_NOISE = " \t\n*_`\"':[]"


def _starts(text: str, word: str) -> bool:
    text = " ".join(text.strip(_NOISE).upper().split())
    return bool(text) and (word.startswith(text) or text.startswith(word))


def _reading(token: str) -> str | None:
    """Which verdict a token at the verdict's position begins: "unfaithful", "faithful" or neither."""
    if _starts(token, "UNFAITHFUL") or _starts(token, "NOT FAITHFUL"):
        return "unfaithful"
    return "faithful" if _starts(token, "FAITHFUL") else None


def _token_at(offsets: Sequence[int], position: int) -> int:
    """Index of the token whose text covers character `position` of the concatenation."""
    for i in range(len(offsets) - 1):
        if offsets[i] <= position < offsets[i + 1]:
            return i
    return len(offsets) - 2


def verdict_probability(tokens: Sequence[TokenChoice]) -> float | None:
    """P(UNFAITHFUL) at the verdict; None when the tokens show no verdict."""
    text = "".join(t.token for t in tokens)
    found = _VERDICT_AT.search(text)
    if found is None or found.end() >= len(text):
        return None
    offsets = [0]
    for t in tokens:
        offsets.append(offsets[-1] + len(t.token))
    index = _token_at(offsets, found.end())
    at = tokens[index]
    mass = {"unfaithful": 0.0, "faithful": 0.0}
    listed = dict(at.top)
    listed.setdefault(at.token, at.logprob)
    for token, logprob in listed.items():
        # the chosen token may carry text before the verdict (": UN"); read it from the verdict on
        reading = _reading(token[found.end() - offsets[index] :] if token == at.token else token)
        if reading is not None:
            mass[reading] += math.exp(logprob)
    total = mass["unfaithful"] + mass["faithful"]
    return mass["unfaithful"] / total if total > 0 else None


def number_probability(tokens: Sequence[TokenChoice]) -> float:
    """P(the sentence number as written), the product of its tokens' probabilities; 1.0 without one."""
    text = "".join(t.token for t in tokens)
    found = _NUMBER_AT.search(text)
    if found is None:
        return 1.0
    start, end = found.span(1)
    p, offset = 1.0, 0
    for t in tokens:
        if offset < end and offset + len(t.token) > start:
            p *= math.exp(t.logprob)
        offset += len(t.token)
    return p


def flag_confidence(tokens: Sequence[TokenChoice] | None) -> float | None:
    """P(the flagged sentence is unfaithful) as the judge's tokens show it; None: unknown."""
    if not tokens:
        return None
    verdict = verdict_probability(tokens)
    return None if verdict is None else verdict * number_probability(tokens)
