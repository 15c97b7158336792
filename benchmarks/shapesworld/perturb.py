"""Controlled errors: wrong colour, shape, size, position or count.

Two levels. `perturb_objects` changes what a model *believes* is in the image (one object recoloured,
reshaped, resized, moved, dropped, or one object invented); a chain built on that belief carries the
error into its reasoning and answer, as real hallucinations do. `perturb_claim` changes one sentence's
claim, for single-sentence examples (self-assessment). Both only return errors that are false of the
true objects, checked, not assumed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from faithproxy.benchmarks.shapesworld.claims import check_claim
from faithproxy.benchmarks.shapesworld.language import RELATIONS, Claim, CountClaim, ObjectClaim, RelationClaim
from faithproxy.benchmarks.shapesworld.scenes import MAX_OBJECTS
from faithproxy.benchmarks.shapesworld.world import CELLS, COLOURS, SHAPES, SIZES, Ref, WorldObject

OBJECT_KINDS: tuple[str, ...] = ("colour", "shape", "size", "position", "drop", "add")
_ALTERNATIVES = {"colour": COLOURS, "shape": SHAPES, "size": SIZES}
_OPPOSITE = {
    "to the left of": "to the right of",
    "to the right of": "to the left of",
    "above": "below",
    "below": "above",
}


@dataclass(frozen=True)
class Perturbation:
    """A hallucinated belief about the scene.

    `original` is the true object that is misdescribed or dropped (None for "add"); `changed` is what
    the model believes in its place (None for "drop").
    """

    kind: str
    believed: tuple[WorldObject, ...]
    original: WorldObject | None
    changed: WorldObject | None


def perturb_objects(objects: Sequence[WorldObject], rng: random.Random, kind: str) -> Perturbation | None:
    """One error of `kind` in the believed objects (reading order kept); None if `kind` can't apply."""
    truth = [o.describe() for o in objects]
    free = [c for c in CELLS if c not in {o.cell for o in truth}]
    if kind == "add":
        if not free:
            return None
        row, col = rng.choice(free)
        new = WorldObject(rng.choice(SHAPES), rng.choice(COLOURS), rng.choice(SIZES), row, col)
        return Perturbation(kind, _reading_order([*truth, new]), None, new)
    if not truth or (kind == "drop" and len(truth) < 2):
        return None
    index = rng.randrange(len(truth))
    original = truth[index]
    if kind == "drop":
        return Perturbation(kind, tuple(truth[:index] + truth[index + 1 :]), original, None)
    if kind == "position":
        row, col = rng.choice(free)
        changed = replace(original, row=row, col=col)
    elif kind in _ALTERNATIVES:
        value = rng.choice([v for v in _ALTERNATIVES[kind] if v != getattr(original, kind)])
        changed = _with_value(original, kind, value)
    else:
        raise ValueError(f"unknown perturbation {kind!r}; expected one of {OBJECT_KINDS}")
    believed = truth[:index] + [changed] + truth[index + 1 :]
    return Perturbation(kind, _reading_order(believed), original, changed)


def _reading_order(objects: list[WorldObject]) -> tuple[WorldObject, ...]:
    return tuple(sorted(objects, key=lambda o: o.cell))


def perturb_claim(claim: Claim, truth: Sequence[WorldObject], rng: random.Random, tries: int = 12) -> Claim | None:
    """A variant of `claim` with one detail changed that is false of `truth`; None if none was found."""
    for _ in range(tries):
        candidate = _vary(claim, rng)
        if candidate is not None and not check_claim(candidate, truth):
            return candidate
    return None


def _vary(claim: Claim, rng: random.Random) -> Claim | None:
    if isinstance(claim, CountClaim):
        return CountClaim(rng.choice([n for n in range(MAX_OBJECTS + 1) if n != claim.n]), claim.ref)
    if isinstance(claim, RelationClaim):
        if rng.random() < 0.5:
            return RelationClaim(claim.subject, _OPPOSITE[claim.relation], claim.anchor)
        return RelationClaim(claim.subject, rng.choice([r for r in RELATIONS if r != claim.relation]), claim.anchor)
    return ObjectClaim(_vary_ref(claim.ref, rng))


def _vary_ref(ref: Ref, rng: random.Random) -> Ref:
    named = [k for k in ("colour", "shape", "size") if getattr(ref, k) is not None]
    if ref.row is not None and ref.col is not None:
        named.append("position")
    kind = rng.choice(named) if named else "shape"
    if kind == "position":
        row, col = rng.choice([c for c in CELLS if c != (ref.row, ref.col)])
        return replace(ref, row=row, col=col)
    return _with_value(ref, kind, rng.choice([v for v in _ALTERNATIVES[kind] if v != getattr(ref, kind)]))


_T = TypeVar("_T", WorldObject, Ref)


def _with_value(obj: _T, attribute: str, value: str) -> _T:
    if attribute == "colour":
        return replace(obj, colour=value)
    if attribute == "shape":
        return replace(obj, shape=value)
    return replace(obj, size=value)
