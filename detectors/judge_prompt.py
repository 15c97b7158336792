"""The judge prompt used during generation (structure of the paper's Table 15) and its reply parser.

The judge sees the question, the image and the partial chain as numbered sentences. It describes the
image first (grounding raised agreement with human annotators), types every sentence PERCEPTION or
REASONING, and names only the FIRST unfaithful perception sentence. No rationales: asking for them
lowered agreement, and they cost output tokens on the critical path.

Two deviations from the paper's wording, both to keep judge calls short:
- the prefix field asks for sentence numbers ("1-3"), not the sentences' text; nothing parses it;
- sentences already accepted are marked as context ("Sentences 1 to m were checked before"), so that a
  judge asked about new steps does not keep reporting a step that is already final.

`parse_judge_reply` is deliberately lenient (judges add markdown, quotes, change case, drop brackets)
but never guesses a verdict: a reply without a Faithfulness field, or UNFAITHFUL without a sentence it
can locate, raises `DetectorError(code="unparseable")`. `parse_judge_prompt` reads the prompt back; the
local judge server (benchmarks/standins/judge_server.py) needs it to play an oracle judge.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode
from faithproxy.faithcore.types import StepKind

JUDGE_SYSTEM_PROMPT = (
    "You are a careful visual fact-checker. You compare what a step-by-step answer says about an image "
    "with what the image actually shows."
)

_QUESTION_HEADER = "Question:"
_CHAIN_HEADER = "Reasoning chain so far, one sentence per line:"
_CHECKED_NOTE = "Sentences 1 to {m} were checked before: read them as context only and do not report them."
_HINT_HEADER = "An earlier look at this image gave this description (correct it if it is wrong):"
_INSTRUCTIONS_HEADER = "Instructions:"

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


def _one_line(text: str) -> str:
    """Sentences travel one per line, so the prompt can be read back unambiguously."""
    return " ".join(text.split())


def build_judge_prompt(
    question: str, sentences: list[str], *, already_checked: int = 0, image_hint: str | None = None
) -> str:
    """The user turn of a judge call; the image(s) go beside it as image parts.

    `already_checked` sentences at the start are context only. `image_hint` is an image description
    from an earlier call on the same image; it is placed after the chain so that successive calls of a
    request share the longest possible prompt prefix (judge-side prefix caching).
    """
    if not 0 <= already_checked <= len(sentences):
        raise ValueError("already_checked must be between 0 and len(sentences)")
    lines = [_QUESTION_HEADER, question.strip(), "", _CHAIN_HEADER]
    lines += [f"Sentence {i}: {_one_line(s)}" for i, s in enumerate(sentences, start=1)]
    lines.append("")
    if already_checked:
        lines += [_CHECKED_NOTE.format(m=already_checked), ""]
    if image_hint and _one_line(image_hint):
        lines += [_HINT_HEADER, _one_line(image_hint), ""]
    lines.append(_INSTRUCTIONS)
    return "\n".join(lines)


class JudgePrompt(NamedTuple):
    question: str
    sentences: list[str]
    already_checked: int
    image_hint: str | None


_SENTENCE_LINE = re.compile(r"^Sentence (\d+): (.*)$")
_CHECKED_LINE = re.compile(r"^Sentences 1 to (\d+) were checked before")


def parse_judge_prompt_details(text: str) -> JudgePrompt:
    """Read back everything `build_judge_prompt` put in; ValueError if `text` is not such a prompt."""
    if not text.startswith(_QUESTION_HEADER + "\n"):
        raise ValueError("not a judge prompt: no question header")
    question, sep, rest = text[len(_QUESTION_HEADER) + 1 :].partition("\n\n" + _CHAIN_HEADER + "\n")
    if not sep:
        raise ValueError("not a judge prompt: no chain header")
    lines = rest.split("\n")
    sentences: list[str] = []
    pos = 0
    while pos < len(lines) and (match := _SENTENCE_LINE.match(lines[pos])):
        if int(match.group(1)) != len(sentences) + 1:
            raise ValueError("not a judge prompt: sentences out of order")
        sentences.append(match.group(2))
        pos += 1
    already_checked, hint = 0, None
    for i in range(pos, len(lines)):
        if lines[i] == _INSTRUCTIONS_HEADER:
            break
        if match := _CHECKED_LINE.match(lines[i]):
            already_checked = int(match.group(1))
        elif lines[i] == _HINT_HEADER and i + 1 < len(lines):
            hint = lines[i + 1]
    else:
        raise ValueError("not a judge prompt: no instructions")
    return JudgePrompt(question, sentences, min(already_checked, len(sentences)), hint)


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


def parse_judge_reply(reply: str, sentences: list[str]) -> JudgeReply:
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
