"""The paper's step-level metrics over labelled chains: UPR, detector F1 and AUROC, and ICC(3,1).

Conventions (the tests pin each one down):

- A step counts for faithfulness only when it is labelled (`faithful` is not null) and its kind is not
  "reasoning"; UPR counts perception steps (kind "perception") and those labelled unfaithful.
- A ratio whose denominator is zero is None (JSON null), never 0: a file without perception steps has
  no UPR, and a detector that never says "unfaithful" has no precision on that class.
- F1 is computed as 2·TP / (2·TP + FP + FN), which equals the harmonic mean of precision and recall
  whenever both exist, and is 0 (not undefined) when the class occurs but was never predicted.
- Detector F1 (`step_f1`) matches predicted to gold steps by (chain id, step index). Chains missing on
  either side, chains whose step counts differ and steps whose texts differ are errors (`MetricError`):
  silently scoring misaligned files would give meaningless numbers. A predicted step without a label is
  an abstention: it counts as "not unfaithful" (a detector gains nothing by abstaining), and the
  number of abstentions is reported; a predicted step typed "reasoning" is likewise "not unfaithful".
- AUROC uses the predicted `score` (P(unfaithful)) of the counted steps that have one, by the rank
  (Mann-Whitney) formula with mid-ranks for ties; None when either class is absent among them.
- ICC(3,1) (two-way mixed, consistency, single rater; Shrout and Fleiss) between raters on per-chain
  counts, matched by chain id: (MS_rows − MS_error) / (MS_rows + (k − 1) · MS_error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from faithproxy.benchmarks.evaluation.labelled import REASONING, LabelledChain, LabelledStep
from faithproxy.faithcore.errors import BenchmarkError


class MetricError(BenchmarkError):
    """Inputs that cannot be scored together (ids or steps that do not match); the message says which."""


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


# ---------------------------------------------------------------------------------------------- UPR


@dataclass(frozen=True)
class UPRResult:
    upr: float | None
    perception_steps: int
    unfaithful_steps: int
    chains: int
    steps: int
    unlabelled_perception_steps: int  # perception steps with faithful = null (unchecked)
    chains_with_unfaithful: int
    # UPR if every unlabelled perception step were unfaithful: the proxy's residual UPR counts unchecked
    # steps so (a chain nobody checked is not a faithful chain)
    upr_unlabelled_as_unfaithful: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def upr(chains: Sequence[LabelledChain]) -> UPRResult:
    """Unfaithful perception steps / perception steps, pooled over all chains."""
    perception = sum(c.perception_steps for c in chains)
    unfaithful = sum(c.unfaithful_steps for c in chains)
    unlabelled = sum(1 for c in chains for s in c.steps if s.is_perception and s.faithful is None)
    return UPRResult(
        upr=_ratio(unfaithful, perception),
        perception_steps=perception,
        unfaithful_steps=unfaithful,
        chains=len(chains),
        steps=sum(len(c.steps) for c in chains),
        unlabelled_perception_steps=unlabelled,
        chains_with_unfaithful=sum(1 for c in chains if c.unfaithful_steps),
        upr_unlabelled_as_unfaithful=_ratio(unfaithful + unlabelled, perception),
    )


# ----------------------------------------------------------------------------------- classification


@dataclass(frozen=True)
class ClassScores:
    """Precision, recall and F1 of one class, with the counts they come from."""

    precision: float | None
    recall: float | None
    f1: float | None
    tp: int
    fp: int
    fn: int
    support: int  # gold steps of this class

    @classmethod
    def of(cls, tp: int, fp: int, fn: int) -> ClassScores:
        return cls(_ratio(tp, tp + fp), _ratio(tp, tp + fn), _ratio(2 * tp, 2 * tp + fp + fn), tp, fp, fn, tp + fn)


@dataclass(frozen=True)
class F1Result:
    unfaithful: ClassScores
    faithful: ClassScores
    steps: int  # steps counted (labelled in gold)
    chains: int
    accuracy: float | None
    abstained: int  # counted steps the prediction left unlabelled (scored as "not unfaithful")
    auroc: float | None
    scored_steps: int  # counted steps with a predicted score

    @property
    def macro_f1(self) -> float | None:
        values = [v for v in (self.unfaithful.f1, self.faithful.f1) if v is not None]
        return sum(values) / len(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        """The unfaithful class at the top level (`precision`, `recall`, `f1`), both classes nested."""
        return {
            "precision": self.unfaithful.precision,
            "recall": self.unfaithful.recall,
            "f1": self.unfaithful.f1,
            "auroc": self.auroc,
            "accuracy": self.accuracy,
            "macro_f1": self.macro_f1,
            "steps": self.steps,
            "chains": self.chains,
            "abstained": self.abstained,
            "scored_steps": self.scored_steps,
            "unfaithful": asdict(self.unfaithful),
            "faithful": asdict(self.faithful),
        }


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def align(
    gold: Sequence[LabelledChain], pred: Sequence[LabelledChain], *, check_text: bool = True
) -> list[tuple[str, int, LabelledStep, LabelledStep]]:
    """(chain id, step index, gold step, predicted step) for every step; MetricError on any mismatch."""
    gold_by_id = {c.id: c for c in gold}
    pred_by_id = {c.id: c for c in pred}
    missing = [i for i in gold_by_id if i not in pred_by_id]
    extra = [i for i in pred_by_id if i not in gold_by_id]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} gold chain(s) have no prediction (e.g. {missing[:3]})")
        if extra:
            parts.append(f"{len(extra)} predicted chain(s) are not in the gold file (e.g. {extra[:3]})")
        raise MetricError("chain ids do not match: " + "; ".join(parts))
    pairs = []
    for chain_id, g in gold_by_id.items():
        p = pred_by_id[chain_id]
        if len(g.steps) != len(p.steps):
            raise MetricError(f"chain {chain_id!r}: gold has {len(g.steps)} steps, prediction {len(p.steps)}")
        for index, (gs, ps) in enumerate(zip(g.steps, p.steps, strict=True)):
            if check_text and not _same_text(gs.text, ps.text):
                raise MetricError(f"chain {chain_id!r}, step {index}: texts differ ({gs.text!r} vs {ps.text!r})")
            pairs.append((chain_id, index, gs, ps))
    return pairs


def predicted_unfaithful(step: LabelledStep) -> bool | None:
    """True/False as the detector said; None for an abstention (no label on a non-reasoning step)."""
    if step.faithful is None:
        return False if step.kind == REASONING else None
    return step.faithful is False and step.kind != REASONING


def step_f1(
    gold: Sequence[LabelledChain],
    pred: Sequence[LabelledChain],
    *,
    check_text: bool = True,
    positions: Callable[[int], bool] | None = None,
) -> F1Result:
    """Scores of `pred` against `gold`; `positions` (0-based step index -> bool) keeps only some steps."""
    tp = fp = fn = tn = abstained = 0
    scores: list[tuple[float, bool]] = []
    for _, index, g, p in align(gold, pred, check_text=check_text):
        if not g.labelled or (positions is not None and not positions(index)):
            continue
        truth = g.faithful is False
        said = predicted_unfaithful(p)
        if said is None:
            abstained += 1
            said = False
        if truth and said:
            tp += 1
        elif said:
            fp += 1
        elif truth:
            fn += 1
        else:
            tn += 1
        if p.score is not None:
            scores.append((p.score, truth))
    counted = tp + fp + fn + tn
    return F1Result(
        unfaithful=ClassScores.of(tp, fp, fn),
        faithful=ClassScores.of(tn, fn, fp),
        steps=counted,
        chains=len(gold),
        accuracy=_ratio(tp + tn, counted),
        abstained=abstained,
        auroc=auroc([s for s, _ in scores], [t for _, t in scores]),
        scored_steps=len(scores),
    )


# The paper's probes, trained on steps i ≤ 2, lost about ten AUROC points on steps i > 2 (1-based).
POSITION_BUCKETS: dict[str, Callable[[int], bool]] = {"i<=2": lambda index: index < 2, "i>2": lambda index: index >= 2}


def f1_by_position(gold: Sequence[LabelledChain], pred: Sequence[LabelledChain], *, check_text: bool = True
                   ) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Unfaithful-class precision, recall, F1 and AUROC on early (i ≤ 2) and later (i > 2) steps."""
    out = {}
    for name, keep in POSITION_BUCKETS.items():
        r = step_f1(gold, pred, check_text=check_text, positions=keep)
        out[name] = {"precision": r.unfaithful.precision, "recall": r.unfaithful.recall, "f1": r.unfaithful.f1,
                     "auroc": r.auroc, "steps": r.steps, "support": r.unfaithful.support}  # fmt: skip
    return out


def auroc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """P(score of a random positive > score of a random negative), ties counting one half."""
    if len(scores) != len(positive):
        raise ValueError("scores and labels differ in length")
    n_pos = sum(1 for p in positive if p)
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[start]]:
            end += 1
        mid = (start + end) / 2 + 1  # ranks are 1-based; tied scores share their mean rank
        for i in order[start : end + 1]:
            ranks[i] = mid
        start = end + 1
    rank_sum = sum(r for r, p in zip(ranks, positive, strict=True) if p)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


# ---------------------------------------------------------------------------------------------- ICC


def icc_3_1(ratings: Sequence[Sequence[float]]) -> float | None:
    """ICC(3,1) of an n × k table (rows: subjects, columns: raters); None when it is undefined
    (fewer than two subjects or raters, or no variance at all)."""
    n = len(ratings)
    k = len(ratings[0]) if n else 0
    if any(len(row) != k for row in ratings):
        raise ValueError("every subject needs one rating per rater")
    if n < 2 or k < 2:
        return None
    grand = sum(sum(row) for row in ratings) / (n * k)
    row_means = [sum(row) / k for row in ratings]
    col_means = [sum(row[j] for row in ratings) / n for j in range(k)]
    ss_total = sum((x - grand) ** 2 for row in ratings for x in row)
    ss_rows = k * sum((m - grand) ** 2 for m in row_means)
    ss_cols = n * sum((m - grand) ** 2 for m in col_means)
    ss_error = max(ss_total - ss_rows - ss_cols, 0.0)
    ms_rows = ss_rows / (n - 1)
    ms_error = ss_error / ((n - 1) * (k - 1))
    denominator = ms_rows + (k - 1) * ms_error
    if denominator <= 1e-12:
        return None
    return (ms_rows - ms_error) / denominator


@dataclass(frozen=True)
class ICCResult:
    icc_perception: float | None
    icc_unfaithful: float | None
    chains: int
    raters: int
    perception_steps_by_rater: list[int]  # totals, in the order the raters were given
    unfaithful_steps_by_rater: list[int]

    def to_dict(self) -> dict[str, Any]:
        """With `perception_steps_a`/`_b` and `unfaithful_steps_a`/`_b` for the first two raters."""
        out = asdict(self)
        for letter, i in (("a", 0), ("b", 1)):
            out[f"perception_steps_{letter}"] = self.perception_steps_by_rater[i]
            out[f"unfaithful_steps_{letter}"] = self.unfaithful_steps_by_rater[i]
        return out


def icc_between(a: Sequence[LabelledChain], b: Sequence[LabelledChain], *more: Sequence[LabelledChain]) -> ICCResult:
    """ICC(3,1) between two (or more) raters on per-chain counts of perception and of unfaithful steps."""
    raters = [{c.id: c for c in rater} for rater in (a, b, *more)]
    ids = list(raters[0])
    for k, rater in enumerate(raters[1:], start=1):
        if set(rater) != set(raters[0]):
            only_first = sorted(set(raters[0]) - set(rater))
            only_this = sorted(set(rater) - set(raters[0]))
            name = "B" if k == 1 else f"rater {k + 1}"
            raise MetricError(f"chain ids do not match: only in A {only_first[:3]} ({len(only_first)}), "
                              f"only in {name} {only_this[:3]} ({len(only_this)})")  # fmt: skip
    perception = [[r[i].perception_steps for r in raters] for i in ids]
    unfaithful = [[r[i].unfaithful_steps for r in raters] for i in ids]
    return ICCResult(
        icc_perception=icc_3_1(perception),
        icc_unfaithful=icc_3_1(unfaithful),
        chains=len(ids),
        raters=len(raters),
        perception_steps_by_rater=[sum(row[k] for row in perception) for k in range(len(raters))],
        unfaithful_steps_by_rater=[sum(row[k] for row in unfaithful) for k in range(len(raters))],
    )
