"""The world language: the fixed grammar of perception sentences, rendered and parsed.

Perception sentences (what `render_claim` writes; `parse_claim` also reads the variants noted):
    There is a large red circle in the top left.        ObjectClaim: at least one such object
    The circle is red. / The object in the centre is a small blue square.   ObjectClaim as well
    There are 3 objects in the image. / There is 1 red circle in the image. CountClaim: exactly n
    There is no blue triangle in the image.             CountClaim with n = 0
    The green triangle is to the left of the red circle.                   RelationClaim
Reasoning sentences start with a connective ("So", "Therefore", ...) or talk about options or the
answer; they are recognised first and never parsed as claims, because a chain's conclusions restate
perception ("So there are 2 circles.") without being new claims about the image.

Numbers are digits when rendered; words (zero-ten) are accepted. "colour"/"color", "centre"/"center",
"big"/"large" and "little"/"small" are accepted so that a model's slips of spelling still parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from faithproxy.benchmarks.shapesworld.world import COLOURS, PLURALS, POSITIONS, SHAPES, SIZES, Ref


@dataclass(frozen=True)
class ObjectClaim:
    """Some object matches `ref`."""

    ref: Ref


@dataclass(frozen=True)
class CountClaim:
    """Exactly `n` objects match `ref`."""

    n: int
    ref: Ref


RELATIONS = ("to the left of", "to the right of", "above", "below")


@dataclass(frozen=True)
class RelationClaim:
    """Some object matching `subject` stands in `relation` to some other object matching `anchor`."""

    subject: Ref
    relation: str
    anchor: Ref


Claim = ObjectClaim | CountClaim | RelationClaim


def render_claim(claim: Claim) -> str:
    if isinstance(claim, ObjectClaim):
        return f"There is {claim.ref.with_article()}."
    if isinstance(claim, CountClaim):
        where = "" if claim.ref.located else " in the image"
        if claim.n == 0:
            return f"There is no {claim.ref.noun_phrase()}{where}."
        if claim.n == 1:
            return f"There is 1 {claim.ref.noun_phrase()}{where}."
        return f"There are {claim.n} {claim.ref.noun_phrase(plural=True)}{where}."
    return f"The {claim.subject.noun_phrase()} is {claim.relation} the {claim.anchor.noun_phrase()}."


# --- parsing -------------------------------------------------------------------------------------

_REASONING_OPENERS = set(
    "so therefore thus hence because since option options answer then this that which none only comparing"
    " counting".split()
)
_REASONING_WORDS = re.compile(r"\b(options?|answer|matches|means|most often|more than any)\b", re.IGNORECASE)

_NUMBER_WORDS = {w: n for n, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_NUMBER_WORDS["no"] = 0
_SYNONYMS = {"color": "colour", "colors": "colours", "center": "centre", "big": "large", "little": "small"}
_SINGULAR = {plural: shape for shape, plural in PLURALS.items()}
# Position phrases -> (row, col); None leaves that coordinate open ("on the left" is any row).
_POSITIONS: dict[str, tuple[int | None, int | None]] = {name: cell for cell, name in POSITIONS.items()} | {
    "middle": (1, 1),
    "middle centre": (1, 1),
    "top centre": (0, 1),
    "bottom centre": (2, 1),
    "centre left": (1, 0),
    "centre right": (1, 2),
    "left": (None, 0),
    "right": (None, 2),
    "top": (0, None),
    "bottom": (2, None),
    "middle column": (None, 1),
    "middle row": (1, None),
    "left side": (None, 0),
    "right side": (None, 2),
}
_POSITIONS |= {
    f"{corner} corner": _POSITIONS[corner] for corner in ("top left", "top right", "bottom left", "bottom right")
}
_POSITION_RE = "|".join(sorted((re.escape(p) for p in _POSITIONS), key=len, reverse=True))
_POSITION_TAIL = rf"(?:in|at|on) the (?P<pos>{_POSITION_RE})(?: of the (?:image|picture|scene))?"
_TRAILING_POSITION = re.compile(rf"^(?P<np>.+?) {_POSITION_TAIL}$")
_PREDICATE_POSITION = re.compile(rf"^{_POSITION_TAIL}$")

_THERE = re.compile(r"^there(?: is| are|'s) (?P<det>an?|no|\d+|[a-z]+) (?P<rest>.+)$")
_THE = re.compile(r"^the (?P<np>.+?) (?:is|are) (?P<pred>.+)$")
_RELATION = re.compile(r"^(?P<rel>" + "|".join(RELATIONS) + r") the (?P<np>.+)$")


def is_reasoning(sentence: str) -> bool:
    """True for sentences that draw conclusions or talk about the options, not about the image."""
    words = _normalise(sentence).split()
    if not words:
        return True
    return words[0] in _REASONING_OPENERS or _REASONING_WORDS.search(sentence) is not None


def parse_claim(sentence: str) -> Claim | None:
    """The claim a perception sentence makes, or None when the sentence is not in the world language."""
    text = _normalise(sentence)
    if match := _THERE.match(text):
        return _parse_there(match.group("det"), match.group("rest"))
    if match := _THE.match(text):
        return _parse_the(match.group("np"), match.group("pred"))
    return None


def _normalise(sentence: str) -> str:
    text = sentence.strip().lower().rstrip(".!").strip()
    text = re.sub(r"[,;]", " ", text)
    words = [_SYNONYMS.get(w, w) for w in text.split()]
    return " ".join(words)


def _parse_there(det: str, rest: str) -> Claim | None:
    rest = re.sub(r" (?:in|of) the (?:image|picture|scene)$", "", rest)
    phrase = _noun_phrase(rest)
    if phrase is None:
        return None
    ref, plural = phrase
    if det in ("a", "an"):
        return None if plural else ObjectClaim(ref)
    n = int(det) if det.isdigit() else _NUMBER_WORDS.get(det)
    if n is None or plural != (n != 1) and n != 0:
        return None
    return CountClaim(n, ref)


def _parse_the(np_text: str, pred: str) -> Claim | None:
    phrase = _noun_phrase(np_text)
    if phrase is None or phrase[1]:
        return None
    ref = phrase[0]
    if match := _RELATION.match(pred):
        anchor = _noun_phrase(match.group("np"))
        if anchor is None or anchor[1]:
            return None
        return RelationClaim(ref, match.group("rel"), anchor[0])
    if pred in COLOURS:
        return _merge(ref, Ref(colour=pred))
    if pred in SIZES:
        return _merge(ref, Ref(size=pred))
    if match := _PREDICATE_POSITION.match(pred):
        row, col = _POSITIONS[match.group("pos")]
        return _merge(ref, Ref(row=row, col=col))
    if match := re.match(r"^an? (?P<np>.+)$", pred):
        other = _noun_phrase(match.group("np"))
        if other is None or other[1]:
            return None
        return _merge(ref, other[0])
    return None


def _merge(a: Ref, b: Ref) -> ObjectClaim | None:
    """One ref from two descriptions of the same object; None when they contradict each other."""
    fields = {}
    for name in ("shape", "colour", "size", "row", "col"):
        x, y = getattr(a, name), getattr(b, name)
        if x is not None and y is not None and x != y:
            return None
        fields[name] = x if x is not None else y
    return ObjectClaim(Ref(**fields))


def _noun_phrase(text: str) -> tuple[Ref, bool] | None:
    """'large red circle in the top left' -> (Ref, plural?). Adjectives may come in either order."""
    row = col = None
    if match := _TRAILING_POSITION.match(text):
        text, (row, col) = match.group("np"), _POSITIONS[match.group("pos")]
    words = text.split()
    if not words:
        return None
    *adjectives, noun = words
    if noun in SHAPES:
        shape, plural = noun, False
    elif noun in _SINGULAR:
        shape, plural = _SINGULAR[noun], True
    elif noun in ("object", "shape", "thing"):
        shape, plural = None, False
    elif noun in ("objects", "shapes", "things"):
        shape, plural = None, True
    else:
        return None
    colour = size = None
    for word in adjectives:
        if word in COLOURS and colour is None:
            colour = word
        elif word in SIZES and size is None:
            size = word
        else:
            return None
    return Ref(shape=shape, colour=colour, size=size, row=row, col=col), plural
