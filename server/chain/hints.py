"""Collaborative hint inference (MIRAGE): an auxiliary LLM reads the question before the generator does.

Switched on per request (`X-Faithproxy-Hints: on`). The auxiliary LLM is one of the server's configured
judges (`FAITHPROXY_HINT_JUDGE` names it; any backend: Anthropic Messages or OpenAI-compatible), asked
with the question text only, no image: it names the question's type, writes a hint for questions of
that type and a hint for this question. The generator then sees, in the last user turn and in this
order, [topic hint, question, question hint]; the images stay where the client put them.

The stage never blocks a request on the auxiliary LLM: a failure, a timeout or a reply without usable
hints leaves the messages as they were, and is counted (`faithproxy_hint_requests_total{outcome}`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from faithproxy.clients.judge_base import JudgeBackend

QUESTION_TYPES = ("counting", "attribute", "spatial", "existence", "comparison", "reading", "reasoning", "other")

HINT_SYSTEM = (
    "You help a vision-language model answer questions about images. You do not see the image. "
    "You only read the question and give short, general advice on how to look and reason."
)

_HINT_TEMPLATE = """Here is a question someone will answer while looking at an image:

{question}

First decide what kind of question it is, choosing one of: {types}.
Then write one sentence of advice that helps with any question of that kind, and one sentence of
advice for this exact question (what to look for in the image, what to be careful about). Do not
answer the question.

Reply in exactly this form:
[Question type]: <kind>
[Topic hint]: <one sentence>
[Question hint]: <one sentence>"""

_MARKUP = re.compile(r"\*\*|__|`")  # bold and code marks some models put around labels
_FIELD = re.compile(r"^\W*\[?\s*(question type|topic hint|question hint)\s*\]?\s*[:\-]\s*(.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class Hints:
    question_type: str
    topic_hint: str
    question_hint: str


def build_hint_prompt(question: str) -> str:
    return _HINT_TEMPLATE.format(question=question.strip(), types=", ".join(QUESTION_TYPES))


def parse_hint_reply(reply: str) -> Hints | None:
    """The three fields of a reply; None unless both hints are there (an unknown type becomes "other")."""
    fields: dict[str, str] = {}
    for line in reply.splitlines():
        if match := _FIELD.match(_MARKUP.sub("", line).strip()):
            key = match.group(1).lower()
            fields.setdefault(key, match.group(2).strip())
    topic, specific = fields.get("topic hint", ""), fields.get("question hint", "")
    if not topic or not specific:
        return None
    kind = fields.get("question type", "").strip(" .<>").lower()
    return Hints(kind if kind in QUESTION_TYPES else "other", topic, specific)


def apply_hints(messages: list[dict[str, Any]], hints: Hints) -> list[dict[str, Any]]:
    """A copy of `messages` whose last user turn reads [topic hint, question, question hint].

    The topic hint goes before the turn's first text part and the question hint after its last one;
    image parts keep their places. A turn without text gets both around an empty question.
    """
    out = copy.deepcopy(messages)
    turn = next((m for m in reversed(out) if m.get("role") == "user"), None)
    if turn is None:
        return out
    before, after = f"Hint about this kind of question: {hints.topic_hint}", f"Hint: {hints.question_hint}"
    content = turn.get("content")
    if isinstance(content, str) or content is None:
        turn["content"] = f"{before}\n\n{content or ''}\n\n{after}"
        return out
    texts = [i for i, part in enumerate(content) if isinstance(part, dict) and part.get("type") == "text"]
    if not texts:
        content.append({"type": "text", "text": f"{before}\n\n{after}"})
        return out
    first, last = content[texts[0]], content[texts[-1]]
    first["text"] = f"{before}\n\n{first.get('text', '')}"
    last["text"] = f"{last.get('text', '')}\n\n{after}"
    return out


async def collect_hints(llm: JudgeBackend, question: str) -> tuple[Hints | None, int, int]:
    """(hints or None, input tokens, output tokens); raises the backend's `DetectorError` on failure."""
    result = await llm.complete(HINT_SYSTEM, build_hint_prompt(question))
    return parse_hint_reply(result.text), result.input_tokens, result.output_tokens
