"""Issue 48's goal for a detector a team can deploy (no pixel oracle), with 95% intervals over chains.

A row meets it when, on held-out scenes: residual UPR is cut by at least 60% against vanilla; its flags on
first drafts have precision >= 0.6 at recall >= 0.6; accuracy is not lower than vanilla's (the paired
difference over the same chains is >= 0; its interval is reported beside it); and it makes at most 2 judge
calls per chain on average. Every rate comes with a percentile bootstrap interval: chains are resampled
with replacement (the same draw for vanilla and the row, so differences are paired), 2,000 draws, seed 0.
Generator tokens and wall time per chain are reported for each row beside vanilla's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from faithproxy.benchmarks.evaluation.shapesworld_rows import draft_scores, parse_row, row_replies
from faithproxy.benchmarks.shapesworld.dataset import Item
from faithproxy.benchmarks.shapesworld.model.scoring import score_reply

UPR_CUT = 0.6
PRECISION = 0.6
RECALL = 0.6
JUDGE_CALLS_PER_CHAIN = 2.0
DRAWS = 2000


def _chains(items: Sequence[Item], replies: Sequence[str]) -> list[dict[str, float]]:
    out = []
    for item, reply in zip(items, replies, strict=True):
        s = score_reply(item, reply)
        out.append({"steps": s.perception_steps, "errors": s.perception_errors, "correct": float(s.correct)})
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def interval(n: int, statistic: Callable[[Sequence[int]], float], seed: int = 0) -> dict[str, Any]:
    """The statistic on all chains and its 95% percentile bootstrap interval over resampled chains."""
    rng = random.Random(seed)
    draws = sorted(statistic([rng.randrange(n) for _ in range(n)]) for _ in range(DRAWS))
    value = statistic(range(n))
    return {
        "value": round(value, 4),
        "ci95": [round(draws[int(0.025 * DRAWS)], 4), round(draws[int(0.975 * DRAWS) - 1], 4)],
    }


def row_figures(
    items: Sequence[Item], vanilla_replies: Sequence[str], contents: Sequence[str], traces: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    van, cor = _chains(items, vanilla_replies), _chains(items, contents)
    flags = [
        draft_scores([item], [trace])["detector_vs_ground_truth"] for item, trace in zip(items, traces, strict=True)
    ]
    n = len(items)

    def upr(rows: list[dict[str, float]], idx: Sequence[int]) -> float:
        return _ratio(sum(rows[i]["errors"] for i in idx), sum(rows[i]["steps"] for i in idx))

    def cut(idx: Sequence[int]) -> float:
        base = upr(van, idx)
        return 1 - upr(cor, idx) / base if base else 0.0

    def precision(idx: Sequence[int]) -> float:
        return _ratio(sum(flags[i]["tp"] for i in idx), sum(flags[i]["tp"] + flags[i]["fp"] for i in idx))

    def recall(idx: Sequence[int]) -> float:
        return _ratio(sum(flags[i]["tp"] for i in idx), sum(flags[i]["tp"] + flags[i]["fn"] for i in idx))

    def accuracy(rows: list[dict[str, float]]) -> Callable[[Sequence[int]], float]:
        return lambda idx: _ratio(sum(rows[i]["correct"] for i in idx), len(idx))

    return {
        "upr_vanilla": interval(n, lambda idx: upr(van, idx)),
        "upr_residual": interval(n, lambda idx: upr(cor, idx)),
        "upr_cut": interval(n, cut),
        "precision": interval(n, precision),
        "recall": interval(n, recall),
        "accuracy_vanilla": interval(n, accuracy(van)),
        "accuracy_corrected": interval(n, accuracy(cor)),
        "accuracy_difference": interval(n, lambda idx: accuracy(cor)(idx) - accuracy(van)(idx)),
    }


def deployable_goals(items: Sequence[Item], raw: Mapping[str, Any], detectors: Sequence[str]) -> dict[str, Any]:
    """The goal's figures for every row, its verdict for the rows that ask no pixel oracle."""
    out: dict[str, Any] = {}
    vanilla_wall = raw["vanilla_wall_s"]
    for name in detectors:
        row = parse_row(name)
        contents, traces, summaries = row_replies(raw, name)
        f = row_figures(items, raw["vanilla_replies"], contents, traces)
        calls = sum((s.get("judge") or {}).get("calls", 0) for s in summaries) / len(items)
        tokens = [(s.get("upstream_usage") or {}).get("completion_tokens") for s in summaries]
        f |= {
            "oracle": row.judge == "pixels",
            "judge_calls_per_chain": round(calls, 3),
            "generator_completion_tokens_per_chain": round(sum(tokens) / len(items), 1)
            if all(isinstance(t, int) for t in tokens)
            else None,
            "wall_s_per_chain": round(raw[name]["wall_s"] / len(items), 3),
            "vanilla_wall_s_per_chain": round(vanilla_wall / len(items), 3),
        }
        if not f["oracle"]:
            f["met"] = {
                "upr_cut": f["upr_cut"]["value"] >= UPR_CUT,
                "precision_at_recall": f["precision"]["value"] >= PRECISION and f["recall"]["value"] >= RECALL,
                "accuracy_not_lower": f["accuracy_difference"]["value"] >= 0,
                "judge_calls": calls <= JUDGE_CALLS_PER_CHAIN,
            }
            f["met"]["all"] = all(f["met"].values())
        out[name] = f
    return out
