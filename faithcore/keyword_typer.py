"""The keyword typer: cue words decide whether a step claims something about the image.

This was the proxy's typer before faithcore.kinds; the step typer now uses its cue patterns as
features (faithcore.step_features), and the typer benchmark compares against it.

The rules, in order (list markers and fillers such as "Okay," or "Wait," are skipped first):

1. A step that opens with a deduction cue ("So", "Therefore", "Because", "The answer is", "Let me
   compute", ...) is REASONING, whatever it mentions: "Therefore there are 2 more squares than
   circles." draws a conclusion.
2. A step with a conclusion or arithmetic anywhere ("the answer is", "option B", "(C)", "3 + 4 = 7",
   "x = 7", "which means") is REASONING.
3. A generic statement about a kind of thing ("A circle has no corners.", "Squares have four
   sides.") is REASONING unless it mentions the image: it is general knowledge.
4. A step that mentions the image or something one sees in it (the image/picture/figure, "I see",
   "there is/are", visible, shows, colours, positions such as left/above/next to, sizes, counts of
   objects, text written or read) is PERCEPTION.
5. Anything else is REASONING. Shape names alone are no cue: "The circle is red." is a claim about
   the image because of "red", not because of "circle".
"""

from __future__ import annotations

import re

from faithproxy.faithcore.types import StepKind

__all__ = ["keyword_kind"]


def _words(*words: str) -> str:
    return r"\b(?:" + "|".join(words) + r")\b"


_LIST_MARKER = re.compile(r"^\s*(?:[-*+\u2022]|\d{1,3}[.)]|[A-Za-z][.)]|\([A-Za-z0-9]{1,3}\))\s+")
_FILLER = re.compile(
    _words(
        "okay", "ok", "alright", "all right", "well", "hmm+", "hm+", "um+", "uh+", "oh", "ah", "wait",
        "now", "right", "yes", "yeah", "no", "actually", "first", "firstly", "second", "secondly",
        "next", "also", "and", "but", "then", "finally",
    )
    + r"[,.!:;]*\s*",
    re.IGNORECASE,
)  # fmt: skip

_DEDUCTION_START = re.compile(
    _words(
        "so", "therefore", "thus", "hence", "because", "since", "consequently", "accordingly",
        "as a result", "it follows", "this means", "that means", "which means", "this implies",
        "in conclusion", "to conclude", "in summary", "to summarize", "overall", "putting .* together",
        "the (?:final |correct )?answer", "(?:final )?answer", "let me", "let's", "let us", "if",
        "assuming", "suppose", "given that", "recall", "remember", "by definition",
        # plans and restatements of the task claim nothing about the image yet
        "i need to", "i should", "i will", "i'll", "we need to", "i have to", "the question", "the task",
    ),
    re.IGNORECASE,
)  # fmt: skip

_DEDUCTION_ANYWHERE = re.compile(
    "|".join(
        (
            _words("therefore", "thus", "hence", "implies", "which means", "this means", "that means"),
            r"\b(?:the|my|final|correct) answer\b",
            r"\banswer (?:is|should be|must be)\b",
            r"\b(?:option|choice)s? [A-Ea-e]\b",
            r"\([A-E]\)",
            r"[\w)]\s*(?:[-+*/\u00d7\u00f7]|=)\s*[\w(]+\s*=",  # a worked equation: 3 + 4 = 7
            r"\b\w\s*=\s*\d",  # an assignment: x = 7
        )
    ),
    re.IGNORECASE,
)

# General knowledge about a kind of thing: "A circle has no corners.", "Squares have four sides."
_GENERIC = re.compile(
    r"(?:(?:a|an|every|each|all|any)\s+\w+|\w+s)\s+(?:has|have|always|never|by definition)\b",
    re.IGNORECASE,
)
_IMAGE = re.compile(
    _words("image", "picture", "photo", "figure", "diagram", "chart", "scene", "see", "visible", "shows?"),
    re.IGNORECASE,
)

# A claim about one particular thing ("The shape is a triangle.", "It is a dog."): a definite subject
# with a copula. General knowledge uses an indefinite or plural subject and is caught by _GENERIC.
_SPECIFIC_OBJECT = re.compile(
    r"(?:the|this|that|it|they|these|those)\b[^.;:]{0,40}?\b(?:is|are|was|were)\s+(?:a|an|the|not|no|one|two|three)\b",
    re.IGNORECASE,
)

_NUMBER = r"(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|several|many|a few)"
_PERCEPTION = re.compile(
    "|".join(
        (
            _words(
                "image", "images", "picture", "photo", "photograph", "figure", "fig", "diagram",
                "chart", "graph", "plot", "screenshot", "scene", "illustration", "drawing", "frame",
            ),
            _words(
                "i see", "i can see", "we see", "we can see", "seen", "visible", "invisible",
                "appears?", "looks? like", "shows?", "shown", "showing", "depicts?", "depicted",
                "displays?", "displayed", "there (?:is|are|was|were|'s)", "contains?", "labell?ed",
                "written", "reads?", "says", "caption", "text", "sign", "looking at",
            ),
            _words(
                "red", "green", "blue", "yellow", "orange", "purple", "pink", "brown", "black",
                "white", "gr[ae]y", "cyan", "magenta", "violet", "gold", "golden", "silver", "beige",
                "teal", "colou?r(?:s|ed)?", "dark", "light", "bright", "striped", "shaded",
            ),
            _words(
                "left", "top", "bottom", "above", "below", "under", "underneath", "beneath",
                "next to", "beside", "behind", "in front of", "cent(?:er|re)", "middle", "corner",
                "foreground", "background", "upper", "lower", "adjacent", "on the right",
                "to the right", "right(?:-hand)? (?:side|corner|of)", "inside", "outside", "on top",
            ),
            _words(
                "large", "larger", "largest", "small", "smaller", "smallest", "big", "bigger",
                "biggest", "tiny", "huge", "tall", "taller", "wide", "narrow", "long", "thick", "thin",
            ),
            # three triangles, 2 red cubes; not "one of us"
            r"\b" + _NUMBER + r"\s+(?:\w+\s+)?(?!(?:its|us|was|has|is|this|does|as|less|plus)\b)\w+s\b",
        )
    ),
    re.IGNORECASE,
)  # fmt: skip


def keyword_kind(text: str) -> StepKind:
    """Guess whether a step is a perception claim or reasoning by cue words (see the module docstring)."""
    body = _LIST_MARKER.sub("", text, count=1)
    while (filler := _FILLER.match(body)) is not None and filler.end() > 0:
        body = body[filler.end() :]
    if _DEDUCTION_START.match(body) or _DEDUCTION_ANYWHERE.search(body):
        return StepKind.REASONING
    if _GENERIC.match(body) and not _IMAGE.search(body):
        return StepKind.REASONING
    if _PERCEPTION.search(body) or _SPECIFIC_OBJECT.match(body):
        return StepKind.PERCEPTION
    return StepKind.REASONING
