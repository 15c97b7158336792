"""Reading the chosen option (or yes/no) out of a real model reply.

Reasoning models rarely answer with a bare letter. The reply is read in this order, and the first rule
that finds something wins:

1. Only the text after the last `</think>` counts as the answer when the reply has one. The reasoning
   is consulted only when there is no answer part at all (a `<think>` that never closed, or nothing
   after it), and then only for the explicit markers of rule 2, not for claims.
2. Explicit markers, the last one in the text: `\\boxed{...}`, `<answer>...</answer>`, "the (final)
   answer is ...", "Answer: ...", "the correct option is ...". What they enclose may be a letter in
   any dress (`B`, `(b)`, `B.`, `B) red`, `Option B`, `\\text{B}`) or the text of an option. Then
   claims about a capital letter: "option C is correct", "C is the right answer", "I choose B".
3. The answer part itself, when it is a letter in such a dress, starts with one (`B. red is ...`), or
   names exactly one option's text.

Anything else is None: callers decide what an unparseable reply counts as (wrong, or FREAK's D).
Lower-case letters count only where they cannot be the article "a" (in brackets, or alone after an
answer marker).
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

LETTERS = string.ascii_uppercase

_THINK_END = re.compile(r"</think\s*>", re.I)
_BOXED = re.compile(r"\\boxed\s*\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.I | re.S)
_MARKER = re.compile(
    r"(?:(?:final|correct|right|best)\s+)?(?:answer|option|choice)\s*(?:is|would\s+be|should\s+be|:|：)\s*(?:[:\-]\s*)?"
    r"(?=(?P<span>[^\n]*))",  # a lookahead, so that every marker of a line is found
    re.I,
)
_LETTER_DRESS = re.compile(
    r"""^(?:option|choice|answer)?\s*          # "Option B"
        (?:\\text\{|\*\*)?\s*                  # LaTeX or markdown wrapping
        (?P<open>[(\[])?\s*(?P<letter>[A-Za-z])\s*(?P<close>[)\]])?
        \s*(?:\}|\*\*)?
        (?P<rest>(?:\s*[.:)\-,]|\s*$).*)?$""",
    re.I | re.S | re.X,
)
# "option C is correct", "C is the right answer", "I choose B": capital letters only (never the article)
_CLAIM = re.compile(
    r"(?:\b(?:option|choice)\s*)?\(?\b(?P<a>[A-Z])\b\)?\s+is\s+(?:the\s+)?(?:correct|right|best)\b"
    r"|\b(?:choose|pick|select|go\s+with)\s+(?:option\s+|choice\s+)?\(?\b(?P<b>[A-Z])\b\)?"
)
_WORD = re.compile(r"[a-z0-9]+(?:[.'][a-z0-9]+)*")


def split_reasoning(text: str) -> tuple[str, str]:
    """(answer part, reasoning part) of a reply: split at the last `</think>`; a `<think>` that never
    closed leaves no answer part."""
    parts = _THINK_END.split(text)
    if len(parts) > 1:
        return parts[-1], "".join(parts[:-1])
    if re.search(r"<think\s*>", text, re.I):  # reasoning that never closed: no answer part
        return "", text
    return text, ""


def _boxed_contents(text: str) -> list[str]:
    """The contents of every `\\boxed{...}`, braces balanced."""
    found = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[start:i])
                    break
    return found


def normalize_text(text: str) -> str:
    """Lower case, LaTeX `\\text{}` unwrapped, punctuation dropped, spaces collapsed."""
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    return " ".join(_WORD.findall(text.lower()))


def _option_in(span: str, options: Sequence[str]) -> int | None:
    """Index of the one option whose text `span` is, or names (whole words); None if none or several."""
    norm = normalize_text(span)
    if not norm:
        return None
    texts = [normalize_text(o) for o in options]
    exact = [i for i, t in enumerate(texts) if t and t == norm]
    if len(exact) == 1:
        return exact[0]
    padded = f" {norm} "
    named = [i for i, t in enumerate(texts) if t and f" {t} " in padded]
    # "dark red" names "red" too: keep only options not contained in another named one
    named = [i for i in named if not any(j != i and f" {texts[i]} " in f" {texts[j]} " for j in named)]
    return named[0] if len(named) == 1 else None


def _parse_span(span: str, letters: str, options: Sequence[str], *, strict_lower: bool) -> str | None:
    """A letter from what an answer marker (or the whole answer part) encloses."""
    span = span.strip().strip("*`\"'“”").strip()
    if boxed := _boxed_contents(span):
        span = boxed[-1]
    match = _LETTER_DRESS.match(span)
    if match:
        letter = match["letter"]
        bracketed = bool(match["open"] and match["close"])
        rest = (match["rest"] or "").strip()
        lower_ok = bracketed or not strict_lower or re.fullmatch(r"[\s.:)\-,!]*", rest) is not None
        if letter.upper() in letters and (letter.isupper() or lower_ok):
            return letter.upper()
    if options:
        index = _option_in(span, options)
        if index is not None and index < len(letters):
            return letters[index]
    return None


def _from_markers(text: str, letters: str, options: Sequence[str], *, claims: bool = True) -> str | None:
    for content in reversed(_boxed_contents(text)):
        if (letter := _parse_span(content, letters, options, strict_lower=False)) is not None:
            return letter
    for content in reversed(_ANSWER_TAG.findall(text)):
        if (letter := _parse_span(content, letters, options, strict_lower=False)) is not None:
            return letter
    for match in reversed(list(_MARKER.finditer(text))):
        span = re.split(r"(?<=[.!?])\s", match["span"], maxsplit=1)[0]  # first sentence after the marker
        if (letter := _parse_span(span, letters, options, strict_lower=True)) is not None:
            return letter
    for match in reversed(list(_CLAIM.finditer(text)) if claims else []):
        if (letter := match["a"] or match["b"]) in letters:
            return letter
    return None


def extract_choice(text: str | None, options: Sequence[str] = (), *, n_options: int | None = None) -> str | None:
    """The letter (A, B, ...) a reply chooses, or None when it cannot be read.

    `options` are the option texts in letter order (used to read an answer given as text and to bound the
    letters); without them `n_options` (default 4) bounds the letters.
    """
    if not text:
        return None
    count = len(options) if options else (n_options or 4)
    letters = LETTERS[:count]
    answer, reasoning = split_reasoning(text)
    if (letter := _from_markers(answer, letters, options)) is not None:
        return letter
    if answer.strip():
        first_line = answer.strip().splitlines()[0]
        if (letter := _parse_span(first_line, letters, options, strict_lower=True)) is not None:
            return letter
        if options and (index := _option_in(answer, options)) is not None:
            return letters[index]
        return None
    return _from_markers(reasoning, letters, options, claims=False)  # musings are not answers


_YES_NO = re.compile(r"\b(yes|no)\b", re.I)


def extract_yes_no(text: str | None) -> str | None:
    """ "yes" or "no" from a reply to a yes/no question, or None.

    Markers first (boxed, answer tags, "the answer is"), then the first word of the answer part, then the
    answer part when it says only one of the two words.
    """
    if not text:
        return None
    answer, reasoning = split_reasoning(text)

    def from_markers(region: str) -> str | None:
        spans = [*_boxed_contents(region), *_ANSWER_TAG.findall(region)]
        spans += [m["span"] for m in _MARKER.finditer(region)]
        for span in reversed(spans):
            words = normalize_text(span).split()
            if words and words[0] in ("yes", "no"):
                return words[0]
        return None

    if (found := from_markers(answer)) is not None:
        return found
    words = normalize_text(answer).split()
    if words and words[0] in ("yes", "no"):
        return words[0]
    said = {m.lower() for m in _YES_NO.findall(answer)}
    if len(said) == 1:
        return said.pop()
    if not answer.strip():
        return from_markers(reasoning)
    return None


def final_answer_span(text: str | None) -> str | None:
    """The text a free-form reply gives as its final answer: the last `\\boxed{}`, else the last
    `<answer>` tag, else the sentence after the last answer marker, else the last line of the answer part."""
    if not text:
        return None
    answer, reasoning = split_reasoning(text)
    for region in (answer, reasoning):
        if boxed := _boxed_contents(region):
            return boxed[-1].strip()
        if tags := _ANSWER_TAG.findall(region):
            return tags[-1].strip()
        if markers := list(_MARKER.finditer(region)):
            return re.split(r"(?<=[.!?])\s", markers[-1]["span"], maxsplit=1)[0].strip()
        lines = [line.strip() for line in region.splitlines() if line.strip()]
        if region is answer and lines:
            return lines[-1]
    return None


def format_options(options: Sequence[str]) -> str:
    """`A. red B. blue C. green`: the option block the prompts append to a question."""
    return " ".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(options))
