"""Punkt parameters built in code, so the segmenter never downloads `punkt`/`punkt_tab` data.

Punkt decides most boundaries from the word before a period and the word after it. A trained model
learns three things we set by hand instead:

- `abbrev_types`: words whose period is not by itself a sentence end ("e.g.", "Fig.", "etc.").
- `ortho_context`: how often a word was seen capitalised or lower case. We have no corpus, so every
  word counts as "usually lower case": a capitalised word after an abbreviation, an ellipsis or an
  initial then starts a new sentence ("etc. The", "Wait... Let", "option B. Cats"), and a lower-case
  one never does ("e.g. near", "Wait... the"). Looking a word up never stores it, so a long-running
  server does not grow this table with every word it has streamed (nltk's own is a `defaultdict`).
- `collocations`: pairs that never break. Punkt only tests membership, so we pass an object that
  answers "yes" for every word after a title or reference abbreviation ("Dr. Smith", "Fig. 2",
  "vs. Paris"), which the all-lower-case assumption above would otherwise split.
"""

from __future__ import annotations

import functools
import re

from nltk.tokenize.punkt import (
    _ORTHO_BEG_UC,
    _ORTHO_MID_LC,
    PunktLanguageVars,
    PunktParameters,
    PunktSentenceTokenizer,
)

# Abbreviations that may still end a sentence: the next word's case decides ("etc. The" splits).
ABBREVIATIONS: frozenset[str] = frozenset(
    {
        "etc", "al", "approx", "ca", "resp", "no", "nos", "jr", "sr", "inc", "ltd", "co", "corp",
        "dept", "est", "esp", "misc", "min", "max", "avg", "incl", "excl", "a.m", "p.m",
    }
)  # fmt: skip

# Abbreviations that never end a sentence: titles, references and Latin connectives.
NEVER_FINAL: frozenset[str] = frozenset(
    {
        "e.g", "eg", "i.e", "ie", "vs", "cf", "viz", "fig", "figs", "eq", "eqs", "sec", "ch", "vol",
        "pp", "ref", "refs", "dr", "mr", "mrs", "ms", "prof", "st", "mt", "u.s", "u.k", "w.r.t", "a.k.a",
    }
)  # fmt: skip

# Punkt's flags for "seen capitalised at a sentence start" and "seen lower case mid-sentence".
_USUALLY_LOWER_CASE = _ORTHO_BEG_UC | _ORTHO_MID_LC


class _OrthoContext(dict[str, int]):
    """Every word is "usually lower case" unless stored otherwise; lookups never store."""

    def __missing__(self, key: str) -> int:
        return _USUALLY_LOWER_CASE


class _NeverFinalCollocations:
    """Stands in for Punkt's collocation set: (word, anything) for every NEVER_FINAL word."""

    def __contains__(self, pair: object) -> bool:
        return isinstance(pair, tuple) and len(pair) == 2 and pair[0] in NEVER_FINAL


class _LanguageVars(PunktLanguageVars):
    """English Punkt variables, plus markdown emphasis as closing punctuation.

    `**Step 1.** Identify` then keeps `**` with the sentence it closes instead of starting the next
    step with it.
    """

    re_boundary_realignment = re.compile(r'["\')\]}\u2018\u2019\u201c\u201d\xab\xbb*_]+?(?:\s+|(?=--)|$)', re.MULTILINE)


class _Tokenizer(PunktSentenceTokenizer):
    """Punkt with its per-candidate decision memoised.

    Punkt decides each candidate from a short context string ("Dr. Smith", "ball. The"), and a
    streaming segmenter asks about the same few candidates on every feed until they are settled.
    """

    def __init__(self) -> None:
        super().__init__(build_parameters(), lang_vars=_LanguageVars())
        self._decide = functools.lru_cache(maxsize=8192)(super().text_contains_sentbreak)

    def text_contains_sentbreak(self, text: str) -> bool:
        return self._decide(text)


def build_parameters() -> PunktParameters:
    params = PunktParameters()
    params.abbrev_types = set(ABBREVIATIONS | NEVER_FINAL)
    params.ortho_context = _OrthoContext()
    params.collocations = _NeverFinalCollocations()  # type: ignore[assignment]
    return params


@functools.cache
def sentence_tokenizer() -> PunktSentenceTokenizer:
    """The shared tokenizer; it holds no per-text state, so every segmenter can use it."""
    return _Tokenizer()
