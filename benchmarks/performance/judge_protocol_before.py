"""The judge protocol as it was before the incremental one (detectors/judge_prompt.py at commit 9840749),
kept only so that benchmarks/performance/judge_cost.py can count what it cost.

Every call sent the whole chain, asked the judge to describe the image again and to type EVERY
sentence of the chain, and carried the instructions in the user turn; an earlier description came back
as a correctable hint after the chain. The reply below is what an obedient judge wrote to it (the old
local judge server's `format_reply`).
"""

from __future__ import annotations

from faithproxy.faithcore.types import StepKind

SYSTEM_PROMPT = (
    "You are a careful visual fact-checker. You compare what a step-by-step answer says about an image "
    "with what the image actually shows."
)

_INSTRUCTIONS = """\
Instructions:
1. Look at the image and describe it briefly.
2. Type every sentence: PERCEPTION if it states what the image shows (objects, attributes, text, \
counts, positions), REASONING otherwise (inference, calculation, planning, general knowledge).
3. A PERCEPTION sentence is UNFAITHFUL only if it misrepresents the image AND that detail matters for \
answering the question. Ignore small mistakes about background details that do not affect the answer. \
REASONING sentences are never unfaithful.
4. Report only the FIRST unfaithful sentence, if there is one. Give no explanations.

Reply in exactly this format:
[Image description]: <one or two sentences>
Sentence 1: PERCEPTION or REASONING
(one such line for every sentence)
[Faithfulness]: FAITHFUL or UNFAITHFUL
[Faithful reasoning chain prefix]: <numbers of the sentences before the first unfaithful one, e.g. 1-3, \
or none>
[First unfaithful sentence]: <Sentence k: its text, or leave blank if all are faithful>"""


def build_prompt(
    question: str, sentences: list[str], *, already_checked: int = 0, image_hint: str | None = None
) -> str:
    """The old user turn (the image went beside it on every call)."""
    lines = ["Question:", question.strip(), "", "Reasoning chain so far, one sentence per line:"]
    lines += [f"Sentence {i}: {' '.join(s.split())}" for i, s in enumerate(sentences, start=1)]
    lines.append("")
    if already_checked:
        lines += [
            f"Sentences 1 to {already_checked} were checked before: read them as context only and do not report them.",
            "",
        ]
    if image_hint:
        lines += ["An earlier look at this image gave this description (correct it if it is wrong):", image_hint, ""]
    lines.append(_INSTRUCTIONS)
    return "\n".join(lines)


def reply(
    description: str, kinds: list[StepKind], unfaithful: list[bool], sentences: list[str], already_checked: int
) -> str:
    """The old reply: a description every time, a typing line for every sentence of the chain."""
    first = next((i for i in range(already_checked, len(sentences)) if unfaithful[i]), None)
    lines = [f"[Image description]: {description}"]
    lines += [f"Sentence {i}: {kind.name}" for i, kind in enumerate(kinds, start=1)]
    if first is None:
        lines += ["[Faithfulness]: FAITHFUL", f"[Faithful reasoning chain prefix]: 1-{len(sentences)}"]
        lines.append("[First unfaithful sentence]:")
    else:
        lines += [
            "[Faithfulness]: UNFAITHFUL",
            f"[Faithful reasoning chain prefix]: {f'1-{first}' if first else 'none'}",
        ]
        lines.append(f"[First unfaithful sentence]: Sentence {first + 1}: {sentences[first]}")
    return "\n".join(lines)
