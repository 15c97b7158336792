"""What the step typer reads in a sentence: a set of named binary features.

Three kinds, all computed offline-safe (no nltk data is downloaded: the Treebank tokenizer is regular
expressions and the Porter stemmer is rules):

- `w:<stem>` for every word, `first:<stem>` and `first2:<stem>_<stem>` for how the sentence opens
  (after list markers and fillers such as "Okay," or "Hmm,");
- `cue:<name>` for the keyword typer's cue patterns (faithcore.keyword_typer) and a few more that mark
  a sentence as a plan, a question to oneself, arithmetic, a quotation or a hedge;
- `len:<bucket>`: short sentences are mostly self-talk ("Good.", "Let's see.").

No part-of-speech tags: nltk's taggers need a downloaded model, and the proxy never downloads.
"""

from __future__ import annotations

import functools
import re

from nltk.stem.porter import PorterStemmer
from nltk.tokenize.treebank import TreebankWordTokenizer

from faithproxy.faithcore import keyword_typer as kw

__all__ = ["CUES", "opening", "step_features"]

_TOKENIZER = TreebankWordTokenizer()
_STEMMER = PorterStemmer()
_WORD = re.compile(r"^[a-z][a-z'\-]*$")

CUES: dict[str, re.Pattern[str]] = {
    # how the sentence opens
    "plan": re.compile(
        r"^(?:let(?:'s| me| us)|i(?:'ll| will| need| have to| should| must| want| can| am going to| think i)"
        r"|we(?:'ll| will| need| have to| should| can)|(?:first|next|now|then),? (?:i|we|let)"
        r"|to (?:find|get|determine|solve|answer|calculate|compute|figure|check|work))\b",
        re.IGNORECASE,
    ),
    "task": re.compile(
        r"^(?:the|this|that) (?:question|user|task|problem|prompt)\b|^(?:the )?user\b|^(?:the )?question\b",
        re.IGNORECASE,
    ),
    "answer": re.compile(r"\b(?:answer|option|choice)s?\b|\(\s*[A-E]\s*\)|\*\*", re.IGNORECASE),
    "conclude": re.compile(r"^(?:so|therefore|thus|hence|that|this|which|it) (?:means|makes|gives|is why)\b", re.I),
    "hypothesis": re.compile(r"^(?:if|assuming|suppose|unless|whether|maybe i|perhaps i)\b", re.IGNORECASE),
    "wh_question": re.compile(
        r"^(?:is|are|was|were|do|does|did|could|can|would|should|will|what|which|who|how|why|where|when)\b[^?]*\?$",
        re.IGNORECASE,
    ),
    "question_mark": re.compile(r"\?\s*$"),
    "arithmetic": re.compile(r"\d\s*[-+*/\u00d7\u00f7^]\s*\(?\d|=|\\(?:frac|times|pi|sqrt)|\b(?:plus|minus|times)\b"),
    "digit": re.compile(r"\d"),
    "quote": re.compile(r"[\"\u201c\u201d]|(?<!\w)'[^']+'(?!\w)"),
    "first_person_see": re.compile(
        r"\b(?:i|we|you) (?:can |could |don't |do not |can't |cannot )?(?:see|notice|spot|make out|count|read)\b",
        re.IGNORECASE,
    ),
    "existential": re.compile(r"^(?:there(?:'s| is| are| was| were)|here(?:'s| is| are))\b", re.IGNORECASE),
    "hedge": re.compile(r"\b(?:seems?|appears?|looks?|probably|likely|might|maybe|about|around|roughly)\b", re.I),
    "knowledge": re.compile(
        r"\b(?:usually|typically|generally|always|never|by definition|conventionally|in general|theorem|formula"
        r"|rule|law|means|indicates?|represents?|characteristic|typical|classic|common)\b",
        re.IGNORECASE,
    ),
    "presenting": re.compile(  # "So I've got this picture of ...", "we have a circle with centre O"
        r"\b(?:i've got|i have got|i've been given|i(?: am|'m) looking at|we(?:'re| are) looking at|we have|we've got"
        r"|here(?:'s| is| we have)|(?:this|it)(?:'s| is) (?:a|an)|i have (?:a|an|this))\b",
        re.IGNORECASE,
    ),
    "absence": re.compile(
        r"\b(?:empty|none|nothing|nobody|no (?:other )?\w+|(?:don't|do not|can't|cannot) see|isn't any|aren't any"
        r"|there's no|there is no|without)\b",
        re.IGNORECASE,
    ),
    "reading": re.compile(  # a value read off the image: "at about 35", "reaches 25", "38%", "80°", "$4.25"
        r"\b(?:is|are|at|reach(?:es|ing)?|of|with|shows?|labell?ed|marked(?: as)?|says|reads)\s+"
        r"(?:about |around |roughly |almost |nearly |approximately |just |exactly |only )?[-$]?\d"
        r"|\d\s*(?:%|\u00b0|cm|mm|km|m|kg|g|ml|l|mph|km/h|v|\u03a9)(?!\w)|\$\d",
        re.IGNORECASE,
    ),
    "text_read": re.compile(
        r"\b(?:titled|title|labell?ed|labels?|says|say|reads?|written|printed|marked|caption|heading|header"
        r"|legend|axis|logo|sign|badge|field|column|row)\b",
        re.IGNORECASE,
    ),
    "enumeration": re.compile(r"(?:[^,]*\d[^,]*,){2,}"),
    "modal": re.compile(r"\b(?:should|would|could|must|might|may)\b", re.IGNORECASE),
    "generic_subject": re.compile(
        r"^(?:(?:a|an|every|each|all|any|most|many)\s+[a-z]+|[a-z]+s)\b(?!.*\b(?:image|picture|photo|figure|here|this)\b)"
        r".*\b(?:is|are|has|have|means|indicates|shows|gives|makes)\b",
        re.IGNORECASE,
    ),
    "self_talk": re.compile(
        r"^(?:ok(?:ay)?|alright|all right|hmm+|hm+|wait|good|great|yes|yeah|no|right|sure|got it|i see|i think"
        r"|i'm|i am|let me think|that's|this is)\b",
        re.IGNORECASE,
    ),
}


def opening(text: str) -> tuple[str, bool]:
    """The sentence without its list marker and leading fillers, and whether a filler was there."""
    body = kw._LIST_MARKER.sub("", text, count=1)
    had_filler = False
    while (filler := kw._FILLER.match(body)) is not None and filler.end() > 0:
        body = body[filler.end() :]
        had_filler = True
    return body.strip(), had_filler


@functools.lru_cache(maxsize=4096)
def _stem(word: str) -> str:
    return _STEMMER.stem(word)


def step_features(text: str) -> frozenset[str]:
    """The features of one step's text (see the module docstring)."""
    body, had_filler = opening(text)
    words = [t for t in _TOKENIZER.tokenize(body.lower()) if _WORD.match(t)]
    stems = [_stem(w) for w in words]
    out = {f"w:{s}" for s in stems}
    if stems:
        out.add(f"first:{stems[0]}")
        out.add(f"first2:{'_'.join(stems[:2])}")
    if had_filler:
        out.add("cue:filler")
    for name, pattern in CUES.items():
        if pattern.search(body):
            out.add(f"cue:{name}")
    if kw._DEDUCTION_START.match(body):
        out.add("cue:kw_deduction_start")
    if kw._DEDUCTION_ANYWHERE.search(body):
        out.add("cue:kw_deduction_anywhere")
    if kw._GENERIC.match(body) and not kw._IMAGE.search(body):
        out.add("cue:kw_generic")
    if kw._PERCEPTION.search(body):
        out.add("cue:kw_perception")
    if kw._SPECIFIC_OBJECT.match(body):
        out.add("cue:kw_specific")
    n = len(words)
    out.add("len:short" if n <= 4 else "len:medium" if n <= 12 else "len:long")
    return frozenset(out)
