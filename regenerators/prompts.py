"""The regeneration prompt (structure of the paper's Table 16), in our own words, and its reply parser.

The prompt goes to the generator with the image. It carries the question, the faithful prefix, and the
flagged sentence; the model must answer with the corrected sentence alone, inside square brackets.
"""

from __future__ import annotations

import re

REGENERATION_TEMPLATE = """\
You are checking a step-by-step answer about the image.
Question: {question}
Steps so far, which match the image:
{prefix}
The next step describes the image incorrectly:
{bad}
Look at the image again and rewrite only that step so that it describes the image correctly. \
Reply with the corrected step alone, inside square brackets.
Example: if the step "The man wears a red scarf." is wrong because he wears a red hat, \
reply [The man wears a red hat.]"""

_EMPTY_PREFIX = "(none)"


def build_regeneration_prompt(question: str, prefix: list[str], bad_sentence: str) -> str:
    return REGENERATION_TEMPLATE.format(
        question=question.strip(),
        prefix="\n".join(prefix) if prefix else _EMPTY_PREFIX,
        bad=bad_sentence.strip(),
    )


_BRACKETED = re.compile(r"\[([^\[\]]+)\]")


def parse_bracketed(reply: str) -> str | None:
    """The corrected sentence: the last non-empty [...] span of the reply, or None (a failed try).

    The last span is taken because models often restate the flagged sentence before answering.
    """
    spans = [s.strip() for s in _BRACKETED.findall(reply) if s.strip()]
    return spans[-1] if spans else None
