"""Trains the step typer's logistic model and writes its parameters to faithcore/step_typer.json.

    python -m faithproxy.benchmarks.evaluation.typer_train            # train, pick the threshold, write
    python -m faithproxy.benchmarks.evaluation.typer_train --dry-run  # the cross-validated figures only

Training data: the tune split only (typer_data.py): the hand-written tune chains, ShapesWorld chains of
the tune seed (weighted down: they are many and all alike) and the typed sentences of
tests/faithcore/test_kinds.py's lists are NOT read (tests are not data). The held-out split is never
read here.

The model sees only the steps the typer's rules (faithcore.kinds.rule_kind) leave to it. Its threshold
is set from leave-one-chain-out cross-validation on the hand-written tune chains: the highest threshold
at which the left-out chains' perception recall among those steps is at least `--recall` (default
0.99, above the 0.97 goal, since a fold of our own chains flatters the model). Weights are L2-regularised, so
a word seen in a few training sentences cannot outvote the cue features it co-occurs with.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from faithproxy.benchmarks.evaluation.labelled import PERCEPTION, LabelledChain
from faithproxy.benchmarks.evaluation.typer_data import load_hand, load_shapesworld
from faithproxy.faithcore.kinds import rule_kind
from faithproxy.faithcore.step_features import step_features
from faithproxy.faithcore.step_typer import PARAMS_PATH

SHAPESWORLD_WEIGHT = 0.25  # all ShapesWorld chains together weigh this share of the hand-written ones
L2 = 3.0
MIN_COUNT = 2  # features seen in fewer training steps are dropped (they cannot be estimated)


def _examples(chains: Sequence[LabelledChain]) -> list[tuple[frozenset[str], int]]:
    """The steps the model decides (the typer's rules settle the others), as (features, is perception)."""
    return [
        (step_features(s.text), int(s.kind == PERCEPTION)) for c in chains for s in c.steps if rule_kind(s.text) is None
    ]


def fit(
    examples: Sequence[tuple[frozenset[str], int]], weights: Sequence[float], l2: float = L2
) -> tuple[float, dict[str, float]]:
    """L2-regularised logistic regression by full-batch Newton steps (the problems are small)."""
    counts: dict[str, int] = {}
    for feats, _ in examples:
        for f in feats:
            counts[f] = counts.get(f, 0) + 1
    names = sorted(f for f, n in counts.items() if n >= MIN_COUNT)
    index = {f: i for i, f in enumerate(names)}
    x = np.zeros((len(examples), len(names) + 1))
    x[:, -1] = 1.0  # the bias, not regularised
    for row, (feats, _) in enumerate(examples):
        for f in feats:
            if f in index:
                x[row, index[f]] = 1.0
    y = np.array([label for _, label in examples], dtype=float)
    w = np.asarray(weights, dtype=float)
    reg = np.full(len(names) + 1, l2)
    reg[-1] = 0.0
    theta = np.zeros(len(names) + 1)
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(x @ theta)))
        grad = x.T @ (w * (p - y)) + reg * theta
        hessian = (x.T * (w * p * (1 - p))) @ x + np.diag(reg + 1e-9)
        step = np.linalg.solve(hessian, grad)
        theta -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return float(theta[-1]), {f: float(theta[i]) for f, i in index.items() if abs(theta[i]) >= 1e-4}


def probability(bias: float, coef: dict[str, float], feats: frozenset[str]) -> float:
    z = bias + sum(coef.get(f, 0.0) for f in feats)
    return 1.0 / (1.0 + math.exp(-z))


def _training_set(hand: Sequence[LabelledChain], world: Sequence[LabelledChain]):
    hand_ex, world_ex = _examples(hand), _examples(world)
    world_w = SHAPESWORLD_WEIGHT * len(hand_ex) / max(1, len(world_ex))
    return hand_ex + world_ex, [1.0] * len(hand_ex) + [world_w] * len(world_ex)


def cross_validated(hand: Sequence[LabelledChain], world: Sequence[LabelledChain]) -> list[tuple[float | None, int]]:
    """(P(perception), gold) for every hand-written step, each from a model trained without its chain;
    P is None for the steps the rules settle (as reasoning)."""
    out: list[tuple[float | None, int]] = []
    for held in range(len(hand)):
        examples, weights = _training_set([c for i, c in enumerate(hand) if i != held], world)
        bias, coef = fit(examples, weights)
        for step in hand[held].steps:
            label = int(step.kind == PERCEPTION)
            if rule_kind(step.text) is None:
                out.append((probability(bias, coef, step_features(step.text)), label))
            else:
                out.append((None, label))
    return out


def pick_threshold(scored: Sequence[tuple[float | None, int]], recall: float) -> float:
    """The highest threshold whose recall among the model's steps is at least `recall` (a little below
    the score of the perception step that sets it, so that rounding never flips that step)."""
    positives = sorted((p for p, label in scored if label and p is not None), reverse=True)
    keep = math.ceil(recall * len(positives))
    return positives[keep - 1] * 0.999


def summary(scored: Sequence[tuple[float | None, int]], threshold: float) -> str:
    """The whole typer's figures (rules, then the model at `threshold`)."""
    positives = sum(label for _, label in scored)
    typed = [(p is not None and p >= threshold, label) for p, label in scored]
    hits = sum(t and label for t, label in typed)
    sent = sum(t for t, _ in typed)
    return (
        f"recall {hits / positives:.3f}  precision {hits / max(1, sent):.3f}  "
        f"sent {sent / len(scored):.2f}  ({len(scored)} steps, {positives} perception)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recall", type=float, default=0.99, help="cross-validated recall to reach")
    parser.add_argument("--dry-run", action="store_true", help="print the figures, write nothing")
    parser.add_argument("--out", type=Path, default=PARAMS_PATH)
    args = parser.parse_args(argv)

    hand, world = load_hand("tune"), load_shapesworld("tune")
    scored = cross_validated(hand, world)
    threshold = pick_threshold(scored, args.recall)
    print(f"leave-one-chain-out on the hand-written tune chains, threshold {threshold:.4f}:")
    print(" ", summary(scored, threshold))
    examples, weights = _training_set(hand, world)
    bias, coef = fit(examples, weights)
    print(f"final model: {len(coef)} features, on {len(examples)} steps")
    if args.dry_run:
        return 0
    params = {
        "about": "faithcore/step_typer.py's logistic model; written by benchmarks/evaluation/typer_train.py",
        "threshold": round(threshold, 6),
        "bias": round(bias, 6),
        "weights": {f: round(w, 6) for f, w in sorted(coef.items())},
    }
    args.out.write_text(json.dumps(params, indent=0, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
