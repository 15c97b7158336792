"""Incremental step segmenter: streamed text in, steps (sentences) out.

`StepSegmenter.feed(text)` returns the steps whose end is final; `flush()` returns the rest. Like
httpx's `LineDecoder` it is pure and synchronous, and any chunking of the same text yields the same
segments as feeding it at once.

How text is cut:

- Tags (`<think>` and `</think>` by default; a reasoning format may name others, such as GLM's
  `<answer>` and `</answer>`: `faithcore.reasoning_formats`), blank lines, line starts that open a
  list item (`- `, `* `, `+ `, `1. `, `2) `, `a) `, `(B) `) or a markdown heading (`## `), the end of
  a heading line, and the end of a line that closes bold text or ends with a colon ("**Step 1**",
  "Options:") end a block. A step never spans a block end; a single newline inside a paragraph is
  just whitespace.
- Within a block, nltk's Punkt finds sentence ends (parameters built in code, see
  `faithcore.punkt_params`): decimals, abbreviations, quotes closing a sentence and ellipses are its
  business. A Punkt boundary inside LaTeX (`$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`) is ignored,
  and a list marker that starts a line is hidden from Punkt so that "1. First item." stays one step.
- A cut lies right after a step's last character, so whitespace and tags between two steps lead the
  next segment's `raw`. `text` is the step without them.

The emission rule that makes chunking irrelevant: the buffer's first step is emitted as soon as no
continuation of the text could move or remove its end, i.e. its block has ended, or Punkt found an end
followed by one complete word (a whitespace-terminated run) with no LaTeX left open before it.
Everything else waits. After each cut the buffer restarts at the cut, in both the chunked and the
one-shot run.

`flush()` emits what is left; its last segment may have `text == ""` when only whitespace or tags
trail (e.g. "</think>\\n"), so that the `raw` of all segments always concatenates to the input.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass

from faithproxy.faithcore.punkt_params import sentence_tokenizer
from faithproxy.faithcore.types import Segment

__all__ = ["THINK_TAGS", "StepSegmenter", "segment_text"]

THINK_TAGS = ("<think>", "</think>")
_MARKER = r"(?:[-*+\u2022]|\d{1,3}[.)]|[A-Za-z][.)]|\([A-Za-z0-9]{1,3}\))"
_HEADING = re.compile(r"#{1,6}[^\S\n]")
_OTHER_BLOCK_ENDS = (
    r"|\n[^\S\n]*\n"  # a blank line
    r"|\n[^\S\n]*(?=(?:" + _MARKER + r"|#{1,6})[^\S\n])"  # a list item or heading starts a line
    r"|(?<=\*\*|.:)[^\S\n]*\n"  # a line ends with bold text ("**Step 1**") or a colon ("Options:")
)


@dataclass(frozen=True)
class _TagRules:
    """The patterns that depend on which markers bound steps (a reasoning format's tags)."""

    tags: tuple[str, ...]
    leading_junk: re.Pattern[str]
    block_end: re.Pattern[str]
    longest: int
    # Characters without which no step can end: Punkt's sentence-end characters (and "…", which it
    # reads as "..."), a newline (every other block end), and the first character of each tag.
    may_cut: re.Pattern[str]
    # The block-end part of those: a newline or a tag's first character.
    may_end_block: re.Pattern[str]


@functools.lru_cache(maxsize=32)
def _tag_rules(tags: tuple[str, ...]) -> _TagRules:
    alternatives = "|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True))
    return _TagRules(
        tags=tags,
        leading_junk=re.compile(r"(?:\s+|" + alternatives + r")*"),
        block_end=re.compile("(?:" + alternatives + ")" + _OTHER_BLOCK_ENDS),
        longest=max(len(t) for t in tags),
        may_cut=re.compile("[" + re.escape(".?!\u2026\n" + "".join(sorted({t[0] for t in tags}))) + "]"),
        may_end_block=re.compile("[" + re.escape("\n" + "".join(sorted({t[0] for t in tags}))) + "]"),
    )


_LIST_MARKER = re.compile(_MARKER + r"[^\S\n]+")
_SENTENCE_END_CHAR = re.compile("[.?!\u2026]")
_WORD_THEN_SPACE = re.compile(r"\S\s")
# One complete word after a cut: Punkt reads no further than the next whitespace-terminated run.
_LOOKAHEAD = re.compile(r"\s*\S+\s")
_COMPLETE_RUN = re.compile(r"(?<=\s)\S+(?=\s)")
_MATH_DELIM = re.compile(r"\\.|\\\Z|\$\$|\$", re.DOTALL)
_MATH_CLOSERS = {"$$": "$$", "\\[": "\\]", "\\(": "\\)"}
_CURRENCY = re.compile(r"\$\d[\d,.]*")


@dataclass(frozen=True)
class _Math:
    """LaTeX spans found in a block, and where an unclosed one starts (it may still close)."""

    spans: list[tuple[int, int]]
    pending: int | None

    def covers(self, pos: int) -> bool:
        return any(start < pos < end for start, end in self.spans)


def _scan_math(text: str, start: int, end: int, closed: bool) -> _Math:
    """Find LaTeX spans in text[start:end].

    In an open block (`closed=False`) a delimiter whose meaning depends on text not yet seen makes
    everything from it on `pending`. Inline `$` follows pandoc: the opener is followed by a non-space,
    the closer preceded by one and not followed by a digit; `$5` and `$3.50` are money, not math.
    """
    spans: list[tuple[int, int]] = []
    pos = start
    while (m := _MATH_DELIM.search(text, pos, end)) is not None:
        delim, at = m.group(), m.start()
        if delim == "\\" or (delim == "$" and m.end() == end):
            if not closed:
                return _Math(spans, at)  # could still become `\(`, `\[`, `$$`, ...
            pos = m.end()
            continue
        if delim == "$":
            close = _inline_math_end(text, at, end, closed)
        elif delim in _MATH_CLOSERS:
            found = text.find(_MATH_CLOSERS[delim], m.end(), end)
            close = found + len(_MATH_CLOSERS[delim]) if found >= 0 else (-1 if closed else None)
        else:  # an escape such as `\$` or `\\`
            pos = m.end()
            continue
        if close is None:
            return _Math(spans, at)
        if close < 0:
            pos = m.end()  # a lone delimiter is literal text
            continue
        spans.append((at, close))
        pos = close
    return _Math(spans, None)


def _inline_math_end(text: str, at: int, end: int, closed: bool) -> int | None:
    """End of the `$...$` opened at `at`; -1 when it is not math, None when that is not known yet."""
    money = _CURRENCY.match(text, at, end)
    if money is not None:
        if money.end() == end:
            return -1 if closed else None
        after = text[money.end()]
        if after.isspace() or after in ";:!?)" or money.group()[-1] in ".,":
            return -1
    if text[at + 1].isspace():
        return -1
    pos = at + 1
    while (close := text.find("$", pos, end)) >= 0:
        if text[close - 1] == "\\" or text[close - 1].isspace():
            pos = close + 1
            continue
        if close + 1 == end:
            return close + 1 if closed else None
        if not text[close + 1].isdigit():
            return close + 1
        pos = close + 1
    return -1 if closed else None


def _punkt_ends(text: str, closed: bool) -> list[int]:
    """Sentence ends Punkt finds in `text`, not counting the end of the text itself.

    Punkt knows "..." but not "…": it reads a copy with each "…" spelled "..." and the ends are
    mapped back. When more text may follow (`closed=False`), Punkt reads a word past the end, so
    that a sentence end it moves onto closing quotes at the very end of the text ('STOP."') is
    reported rather than mistaken for the end of the text.
    """
    has_ellipsis = "\u2026" in text
    shadow = text.replace("\u2026", "...") if has_ellipsis else text
    if not closed:
        shadow += " x"
    ends = [end for _, end in sentence_tokenizer().span_tokenize(shadow)]
    limit = len(shadow.rstrip())
    ends = [end for end in ends if end < limit]
    if not has_ellipsis or not ends:
        return ends
    # Shadow offset just past each "...", in order; every one of them shifts later text by two.
    widened = [i + 2 * k + 3 for k, i in enumerate(m.start() for m in re.finditer("\u2026", text))]
    return [end - 2 * bisect.bisect_right(widened, end) for end in ends]


def _run_start(text: str, pos: int, floor: int) -> int:
    """Start of the whitespace-delimited run that contains text[pos]."""
    while pos > floor and not text[pos - 1].isspace():
        pos -= 1
    return pos


class StepSegmenter:
    """Cuts streamed reasoning text into steps; see the module docstring for the rules.

    `feed` returns only steps whose end can no longer change, each with non-empty `text`. `flush`
    returns the rest, possibly ending with one segment whose `text` is "" that carries trailing
    whitespace or tags. Indices start at `start_index` and run on across calls.
    """

    def __init__(self, start_index: int = 0, tags: tuple[str, ...] = THINK_TAGS) -> None:
        self._rules = _tag_rules(tuple(tags))
        self._next_index = start_index
        self._buffer = ""
        # Buffer offset before which Punkt has nothing more to decide (see `_remember_progress`).
        self._resume = 0
        # Buffer offset before which no block end can start any more (see `_find_block_end`).
        self._block_scan = 0
        self._at_text_start = True  # nothing emitted since construction or the last flush
        # Whether the buffer, from where Punkt and the block-end scan still have something to decide,
        # holds a character a step end needs (`_TagRules.may_cut`). Without one no cut is possible, so
        # most deltas (the words inside a sentence) skip Punkt altogether; with one, every feed runs the
        # full decision (a pending period still waits for the next word).
        self._may_cut = False

    def feed(self, text: str) -> list[Segment]:
        if not text:
            return []
        self._buffer += text
        if not self._may_cut:
            if self._rules.may_cut.search(text) is None:
                return []
            self._may_cut = True
        if not self._cut_possible():
            return []
        segments = []
        while self._may_cut and (cut := self._next_cut(final=False)) is not None:
            segments.append(self._emit(*cut))
        if self._may_cut:  # no cut yet: only what Punkt and the block-end scan have not ruled out counts
            since = min(self._resume, self._block_scan)
            self._may_cut = self._rules.may_cut.search(self._buffer, since) is not None
        return segments

    def _cut_possible(self) -> bool:
        """False when no step can end yet, without running Punkt: no newline or tag start is left to
        decide, and no complete word follows the first undecided sentence-end character (an end
        outside a block end is emitted only once the word after it is complete)."""
        buffer, rules = self._buffer, self._rules
        since = min(self._resume, self._block_scan)
        if rules.may_end_block.search(buffer, since) is not None:
            return True
        end_char = _SENTENCE_END_CHAR.search(buffer, since)
        return end_char is not None and _WORD_THEN_SPACE.search(buffer, end_char.end()) is not None

    def settled_lead(self) -> str:
        """The whitespace and complete tags the buffer starts with: read after the last step, final (no
        later text can make them part of a step), and the start of the next segment's `raw`."""
        return self._buffer[: self._rules.leading_junk.match(self._buffer).end()]  # type: ignore[union-attr]

    def flush(self) -> list[Segment]:
        segments = []
        while self._buffer:
            cut = self._next_cut(final=True)
            if cut is None:  # only whitespace and tags are left
                segments.append(Segment(self._next_index, "", self._buffer))
                self._next_index += 1
                self._buffer = ""
                break
            segments.append(self._emit(*cut))
        self._resume = 0
        self._block_scan = 0
        self._at_text_start = True
        self._may_cut = False
        return segments

    def _emit(self, content_start: int, end: int) -> Segment:
        buffer = self._buffer
        segment = Segment(self._next_index, buffer[content_start:end].strip(), buffer[:end])
        self._next_index += 1
        self._buffer = buffer[end:]
        self._resume = 0
        self._block_scan = 0
        self._at_text_start = False
        self._may_cut = self._rules.may_cut.search(self._buffer) is not None
        return segment

    def _next_cut(self, final: bool) -> tuple[int, int] | None:
        """(content start, end) of the buffer's first step when that end is final, else None."""
        buffer = self._buffer
        rules = self._rules
        start = rules.leading_junk.match(buffer).end()  # type: ignore[union-attr]
        if start == len(buffer):
            return None
        if (
            not final
            and len(buffer) - start <= rules.longest
            and any(tag.startswith(buffer[start:]) for tag in rules.tags)
        ):
            return None  # maybe the start of a tag

        block_end_match = self._find_block_end(start)
        raw_end = block_end_match.start() if block_end_match is not None else None
        at_line_start = self._at_line_start(start)
        if at_line_start and _HEADING.match(buffer, start):  # a heading is a block of one line
            newline = buffer.find("\n", start, raw_end)
            raw_end = raw_end if newline < 0 else newline
        closed = final or raw_end is not None
        if closed:
            end = start + len(buffer[start:raw_end].rstrip())
        else:
            end = len(buffer)

        marker = _LIST_MARKER.match(buffer, start, end) if at_line_start else None
        base = max(marker.end() if marker is not None else start, self._resume)
        math = _scan_math(buffer, base, end, closed)
        cut = None
        for cut in (base + rel for rel in _punkt_ends(buffer[base:end], closed)):
            if math.covers(cut):
                continue
            if closed:
                return start, cut
            if (math.pending is None or cut <= math.pending) and _LOOKAHEAD.match(buffer, cut):
                return start, cut
            break
        else:
            cut = None
        if closed:
            return start, end
        self._remember_progress(base, cut, math)
        return None

    def _find_block_end(self, start: int) -> re.Match[str] | None:
        """The first tag, blank line or list item after `start`, scanning only text not yet ruled out.

        A block end that has not matched yet can only start in the last characters (a partial tag or
        list marker: as many as the longest tag, and at least 8) or in the whitespace just before them (a
        newline still waiting for its line).
        """
        buffer = self._buffer
        found = self._rules.block_end.search(buffer, max(start, self._block_scan))
        if found is None:
            scan = max(start, len(buffer) - max(8, self._rules.longest))
            while scan > start and buffer[scan - 1].isspace():
                scan -= 1
            self._block_scan = scan
        return found

    def _at_line_start(self, start: int) -> bool:
        """Whether the step starting at buffer[start] starts a line (only then can it be a list item)."""
        newline = self._buffer.rfind("\n", 0, start)
        if newline < 0:
            return self._at_text_start and (start == 0 or self._buffer[:start].isspace())
        return self._buffer[newline:start].isspace()

    def _remember_progress(self, base: int, undecided_cut: int | None, math: _Math) -> None:
        """Let the next feed skip text Punkt has already ruled out.

        Punkt decides a candidate from the word before it and the word after it. So text before a
        run that is complete (whitespace on both sides) and precedes every undecided cut and any
        open LaTeX holds no sentence end that future text could create: Punkt can start at that run.
        """
        buffer = self._buffer
        limit = len(buffer) if math.pending is None else math.pending
        if undecided_cut is not None:
            # Realignment may have moved the cut past a space onto closing quotes or `**`, so the
            # period Punkt decided on can sit one run earlier; stay before that run too.
            run = _run_start(buffer, undecided_cut - 1, base)
            before = len(buffer[base:run].rstrip()) + base
            limit = min(limit, _run_start(buffer, before - 1, base) if before > base else base)
        resume = self._resume
        for run in _COMPLETE_RUN.finditer(buffer, base):
            if run.start() > limit:
                break
            if not math.covers(run.start()):
                resume = run.start()
        self._resume = max(resume, self._resume)


def segment_text(text: str, start_index: int = 0, tags: tuple[str, ...] = THINK_TAGS) -> list[Segment]:
    """Segment a whole text at once (feed + flush)."""
    segmenter = StepSegmenter(start_index, tags)
    return segmenter.feed(text) + segmenter.flush()
