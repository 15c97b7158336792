"""The self-assessment prompt: the generator is asked whether its own step matches the image."""

from __future__ import annotations

import re

SELF_CHECK_TEMPLATE = """\
Question: {question}
Steps so far:
{prefix}
Next step: {sentence}
Does the next step describe the image correctly? Answer FAITHFUL or UNFAITHFUL."""


def build_self_check_prompt(question: str, prefix: list[str], sentence: str) -> str:
    return SELF_CHECK_TEMPLATE.format(
        question=question.strip(), prefix="\n".join(prefix) if prefix else "(none)", sentence=sentence.strip()
    )


_ANSWER = re.compile(r"\b(UNFAITHFUL|FAITHFUL)\b", re.IGNORECASE)


def parse_self_check(reply: str) -> bool | None:
    """True = faithful, False = unfaithful, None = no verdict in the reply."""
    match = _ANSWER.search(reply)
    if match is None:
        return None
    return match.group(1).upper() == "FAITHFUL"
