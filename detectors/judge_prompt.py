"""The judge protocol used during generation (structure of the paper's Table 15) and its reply parser.

The judge sees the question, the image and the chain so far as numbered sentences, and is asked about
the NEW sentences only. It describes the image first (grounding raised agreement with human annotators),
types each new sentence PERCEPTION or REASONING, and names only the FIRST unfaithful perception sentence.
No rationales: asking for them lowered agreement, and they cost output tokens on the critical path.

What changed from Table 15, each to keep a request's judge bill linear in the chain (docs/judge.md):
- incremental: the sentences already accepted are context; the judge types and judges only the new
  ones, so its output per checked sentence stays the same however long the chain grows;
- one description per request: the judge describes the image in its first reply, and that description
  is part of every later prompt of the request (the judge's own grounding, never asked for again);
- the `[Faithful reasoning chain prefix]` field is gone (it is the sentences before the first unfaithful
  one, which the number in `[First unfaithful sentence]` already says), and that number replaces the
  sentence's text;
- the instructions and the reply format live in the system prompt, and the user turn is laid out so that
  every call of a request starts with the same prefix: image(s), question, description, then the chain,
  cut into blocks at the same places as before (`splits`), the request for this call last. A prompt
  cache (Anthropic's breakpoints, vLLM's prefix cache) then serves all of it but the new sentences.

`parse_judge_reply` is deliberately lenient (judges add markdown, quotes, change case, drop brackets)
but never guesses a verdict: a reply without a Faithfulness field, or UNFAITHFUL without a sentence it
can locate, raises `DetectorError(code="unparseable")`. `parse_judge_prompt_details` reads a prompt
back; the local judge server (benchmarks/standins/judge_server.py) needs it to play an oracle judge.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from faithproxy.clients.judge_base import TextBlock, turn_text
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode
from faithproxy.faithcore.types import StepKind

JUDGE_SYSTEM_PROMPT = """\
You are a careful visual fact-checker. You compare what a step-by-step answer says about an image with \
what the image actually shows.

Each request gives you the image, the question, the reasoning chain written so far (one numbered \
sentence per line) and the sentences to check. The sentences before those were checked already: read \
them as context and never report them. Once you have described the image, your description comes \
with every later request: rely on it and on the image.

Instructions:
1. When the request asks for an image description, look at the image and describe it briefly, before \
anything else.
2. Type each sentence you check: PERCEPTION if it states what the image shows (objects, attributes, \
text, counts, positions), REASONING otherwise (inference, calculation, planning, general knowledge).
3. A PERCEPTION sentence is UNFAITHFUL only if it misrepresents the image AND that detail matters for \
answering the question. Ignore small mistakes about background details that do not affect the answer. \
REASONING sentences are never unfaithful.
4. Report only the FIRST unfaithful sentence among those you check, if there is one. Give no explanations.

Reply in exactly this format and nothing else:
[Image description]: <one or two sentences> (only when the request asks for it)
Sentence k: PERCEPTION or REASONING (one line for each sentence you check, none for the others)
[Faithfulness]: FAITHFUL or UNFAITHFUL
[First unfaithful sentence]: <its number> (only when UNFAITHFUL)"""

_QUESTION_HEADER = "Question:"
_DESCRIPTION_HEADER = "Your description of the image, from your first look at it:"
_CHAIN_HEADER = "Reasoning chain so far, one sentence per line:"
_CHECK_ONE = "Check sentence {first}."
_CHECK_RANGE = "Check sentences {first} to {last}."
_CONTEXT_ONE = " Sentence 1 is context only."
_CONTEXT_RANGE = " Sentences 1 to {m} are context only."
ASK_DESCRIPTION = "Begin with [Image description]."


def _one_line(text: str) -> str:
    """Sentences travel one per line, so the prompt can be read back unambiguously."""
    return " ".join(text.split())


def chain_cuts(n: int, already_checked: int, splits: Iterable[int] = ()) -> list[int]:
    """Where the chain of `n` sentences is cut into blocks: the earlier cuts of the request that fall
    inside it, the end of the accepted part, and the end."""
    inner = {k for k in splits if 0 < k < n}
    if 0 < already_checked < n:
        inner.add(already_checked)
    return [*sorted(inner), n]


def build_judge_turn(
    question: str,
    sentences: list[str],
    *,
    already_checked: int = 0,
    description: str | None = None,
    ask_description: bool = False,
    splits: Iterable[int] = (),
) -> list[TextBlock]:
    """The user turn of a judge call as text blocks; the image(s) go before it as image parts.

    Sentences before `already_checked` are context; the judge is asked about the rest. `description` is
    the judge's own description from an earlier call of the request; with `ask_description` (and none
    given) the judge is asked to write one first. The chain is cut at `chain_cuts(...)`, so calls that
    pass the same earlier cuts render the accepted chain as the same blocks, byte for byte. Cache marks:
    the question (shared by every call, with or without a description), the end of the accepted part,
    and the end of the chain (the next call's accepted part, when all new sentences pass).
    """
    n = len(sentences)
    if not 0 <= already_checked < n:
        raise ValueError("need at least one sentence to check: already_checked must be below len(sentences)")
    blocks = [TextBlock(f"{_QUESTION_HEADER}\n{question.strip()}\n\n", cache=True)]
    description = _one_line(description) if description else None
    if description:
        blocks.append(TextBlock(f"{_DESCRIPTION_HEADER}\n{description}\n\n"))
    start = 0
    for cut in chain_cuts(n, already_checked, splits):
        lines = [f"Sentence {i}: {_one_line(s)}\n" for i, s in enumerate(sentences[start:cut], start=start + 1)]
        header = f"{_CHAIN_HEADER}\n" if start == 0 else ""
        blocks.append(TextBlock(header + "".join(lines), cache=cut in (already_checked, n)))
        start = cut
    first = already_checked + 1
    ask = _CHECK_ONE.format(first=first) if first == n else _CHECK_RANGE.format(first=first, last=n)
    if already_checked:
        ask += _CONTEXT_ONE if already_checked == 1 else _CONTEXT_RANGE.format(m=already_checked)
    if ask_description and not description:
        ask += " " + ASK_DESCRIPTION
    blocks.append(TextBlock(f"\n{ask}\n"))
    return blocks


def build_judge_prompt(
    question: str,
    sentences: list[str],
    *,
    already_checked: int = 0,
    description: str | None = None,
    ask_description: bool = False,
    splits: Iterable[int] = (),
) -> str:
    """The user turn of `build_judge_turn` as one text (what an OpenAI-compatible judge receives)."""
    return turn_text(
        build_judge_turn(
            question,
            sentences,
            already_checked=already_checked,
            description=description,
            ask_description=ask_description,
            splits=splits,
        )
    )


class JudgePrompt(NamedTuple):
    question: str
    sentences: list[str]
    already_checked: int
    description: str | None
    asks_description: bool


_SENTENCE_LINE = re.compile(r"^Sentence (\d+): (.*)$")
_CHECK_LINE = re.compile(r"^Check sentences? (\d+)(?: to (\d+))?\.")


def parse_judge_prompt_details(text: str) -> JudgePrompt:
    """Read back everything `build_judge_prompt` put in; ValueError if `text` is not such a prompt."""
    if not text.startswith(_QUESTION_HEADER + "\n"):
        raise ValueError("not a judge prompt: no question header")
    question, sep, rest = text[len(_QUESTION_HEADER) + 1 :].partition("\n\n" + _CHAIN_HEADER + "\n")
    if not sep:
        raise ValueError("not a judge prompt: no chain header")
    description = None
    head, found, described = question.rpartition("\n\n" + _DESCRIPTION_HEADER + "\n")
    if found:
        question, description = head, described
    lines = rest.split("\n")
    sentences: list[str] = []
    pos = 0
    while pos < len(lines) and (match := _SENTENCE_LINE.match(lines[pos])):
        if int(match.group(1)) != len(sentences) + 1:
            raise ValueError("not a judge prompt: sentences out of order")
        sentences.append(match.group(2))
        pos += 1
    for line in lines[pos:]:
        if match := _CHECK_LINE.match(line):
            first = int(match.group(1))
            if not 1 <= first <= len(sentences):
                raise ValueError("not a judge prompt: it asks about a sentence the chain does not have")
            return JudgePrompt(question, sentences, first - 1, description, ASK_DESCRIPTION in line)
    raise ValueError("not a judge prompt: no sentences to check")


def parse_judge_prompt(text: str) -> tuple[str, list[str]]:
    """(question, sentences) of a prompt built by `build_judge_prompt`."""
    parsed = parse_judge_prompt_details(text)
    return parsed.question, parsed.sentences


# ---------------------------------------------------------------------------------------------- reply


@dataclass(frozen=True)
class JudgeReply:
    """What a judge said. Indices are 0-based positions in the `sentences` list given to the parser."""

    kinds: dict[int, StepKind] = field(default_factory=dict)
    first_unfaithful: int | None = None
    description: str | None = None


_MARKUP = re.compile(r"\*\*|__|`")
_BULLET = re.compile(r"^\s*(?:[-*+>#]+|\d+[.)])\s+")
_LABEL = re.compile(
    r"^\s*\[?\s*(?P<label>faithfulness|faithful reasoning chain prefix|first unfaithful sentence"
    r"|image description|description)\s*\]?\s*(?::|-|=)?\s*(?P<value>.*)$",
    re.IGNORECASE,
)
_SENTENCE_REF = re.compile(r"^\[?\s*sentence\s*(?P<k>\d+)\s*\]?\s*(?:[:.)\-]\s*)?(?P<rest>.*)$", re.IGNORECASE)
_NUMBER_ONLY = re.compile(r"^(?:#|no\.?\s*)?(?P<k>\d+)\s*[.:)]?$", re.IGNORECASE)
_TRAILING_KIND = re.compile(
    r"(?:^|[\s\-\u2013\u2014:|(\[])(?:type\s*[:=]\s*)?(PERCEPTION|REASONING)[\s\])]*$", re.IGNORECASE
)
_TYPE_LINE = re.compile(r"^type\s*[:=]\s*\W*(PERCEPTION|REASONING)\b", re.IGNORECASE)
_VERDICT = re.compile(r"\b(UN\s*FAITHFUL|NOT\s+FAITHFUL|FAITHFUL)\b", re.IGNORECASE)
_QUOTES = " \t\"'\u201c\u201d\u2018\u2019"
_TRIM = _QUOTES + "`*[]()<>.,;:!?"
_BLANK_VALUES = {"", "none", "n/a", "na", "null", "nil", "-", "blank", "nothing", "no", "not applicable"}
_FUZZY_MIN_RATIO = 0.8


def _clean_line(line: str) -> str:
    return _BULLET.sub("", _MARKUP.sub("", line)).strip()


def _normalise(text: str) -> str:
    """Lower case, single spaces, no surrounding quotes or punctuation: how sentences are compared."""
    return " ".join(_MARKUP.sub("", text).split()).strip(_TRIM).lower()


def _unparseable(why: str) -> DetectorError:
    return DetectorError(f"judge reply unparseable: {why}", code=DetectorErrorCode.UNPARSEABLE)


def _verdict_is_unfaithful(value: str) -> bool | None:
    match = _VERDICT.search(value)
    return None if match is None else "".join(match.group(1).split()).upper() != "FAITHFUL"


def _typing(line: str) -> tuple[int, StepKind | None] | None:
    """(k, kind) for a "Sentence k: ..." line; kind is None when the line only names the sentence."""
    ref = _SENTENCE_REF.match(line.lstrip(_QUOTES))
    if ref is None:
        return None
    kind = _TRAILING_KIND.search(ref.group("rest").strip(_TRIM))
    return int(ref.group("k")), (StepKind(kind.group(1).lower()) if kind else None)


def _locate(value: str, sentences: list[str]) -> int | None:
    """Index of the sentence the judge named: by number if given, else exact text, else fuzzy text."""
    value = value.strip(_QUOTES)
    if _normalise(value) in _BLANK_VALUES:
        return None
    ref = _SENTENCE_REF.match(value) or _NUMBER_ONLY.match(value)
    if ref is not None:
        k = int(ref.group("k"))
        if 1 <= k <= len(sentences):
            return k - 1
        value = ref.groupdict().get("rest") or ""  # an out-of-range number: fall back to the text
    wanted = _normalise(value)
    if not wanted:
        return None
    normalised = [_normalise(s) for s in sentences]
    if wanted in normalised:
        return normalised.index(wanted)
    best, best_ratio = None, 0.0
    for i, candidate in enumerate(normalised):
        ratio = difflib.SequenceMatcher(None, wanted, candidate, autojunk=False).ratio()
        if ratio > best_ratio:
            best, best_ratio = i, ratio
    return best if best_ratio >= _FUZZY_MIN_RATIO else None


def parse_judge_reply(reply: str, sentences: list[str]) -> JudgeReply:  # noqa: C901 - a parser (ARCHITECTURE.md)
    """Parse a judge reply about `sentences`; raises only `DetectorError` (code "unparseable").

    Besides our own format it reads the per-sentence block format of the evaluation prompt
    ('Sentence k: "text"' / 'Type: ...' / 'Faithfulness: ...'). A FAITHFUL verdict wins over a
    filled-in first-unfaithful field (judges sometimes echo the last sentence there); an UNFAITHFUL
    verdict needs a sentence that can be located.
    """
    if not isinstance(reply, str):
        raise _unparseable("reply is not text")
    n = len(sentences)
    lines = [_clean_line(line) for line in reply.splitlines()]
    kinds: dict[int, StepKind] = {}
    fields: dict[str, str] = {}
    verdicts: list[bool] = []
    block: int | None = None  # the sentence a block-style "Type:"/"Faithfulness:" line refers to
    block_unfaithful: int | None = None
    preamble: list[str] = []  # lines before the first field or typing line: an unlabelled description
    seen_structure = False
    for pos, line in enumerate(lines):
        if not seen_structure and line and not _LABEL.match(line) and not _typing(line):
            if not line.endswith(":"):  # "Here is my analysis:" is not a description
                preamble.append(line)
            continue
        seen_structure = seen_structure or bool(line)
        if label := _LABEL.match(line):
            name = label.group("label").lower().replace("image description", "description")
            value = label.group("value").strip() or _next_value(lines, pos)
            if name == "faithfulness":
                verdict = _verdict_is_unfaithful(value)
                if verdict is None:
                    continue  # e.g. "Faithfulness: N/A" on a reasoning sentence
                verdicts.append(verdict)
                if verdict and block is not None and block_unfaithful is None:
                    block_unfaithful = block - 1
            fields.setdefault(name, value)
            continue
        if typed := _typing(line):
            k, kind = typed
            in_range = 1 <= k <= n
            if kind is not None and in_range:
                kinds[k - 1] = kind
            block = k if kind is None and in_range else None
            continue
        if (type_line := _TYPE_LINE.match(line)) and block is not None:
            kinds.setdefault(block - 1, StepKind(type_line.group(1).lower()))
    if not verdicts:
        raise _unparseable("no [Faithfulness] field")
    description = fields.get("description") or " ".join(preamble) or None
    if not any(verdicts):
        return JudgeReply(kinds, None, description)
    first = _locate(fields.get("first unfaithful sentence", ""), sentences)
    if first is None:
        first = block_unfaithful
    if first is None:
        raise _unparseable("UNFAITHFUL without a sentence that matches the chain")
    return JudgeReply(kinds, first, description)


def _next_value(lines: list[str], pos: int) -> str:
    """The next non-empty line, unless it is another field or a typing line."""
    for line in lines[pos + 1 :]:
        if not line:
            continue
        if _LABEL.match(line):
            return ""
        typed = _typing(line)
        if typed is not None and typed[1] is not None:
            return ""
        return line
    return ""
