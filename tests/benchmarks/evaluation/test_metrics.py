"""UPR, detector F1/AUROC and ICC(3,1) against small examples computed by hand."""

from __future__ import annotations

import pytest

from faithproxy.benchmarks.evaluation.labelled import LabelledChain, LabelledStep
from faithproxy.benchmarks.evaluation.metrics import (
    MetricError,
    auroc,
    f1_by_position,
    icc_3_1,
    icc_between,
    step_f1,
    upr,
)


def P(faithful: bool | None, score: float | None = None, text: str = "") -> LabelledStep:  # noqa: N802
    return LabelledStep(text or f"p{faithful}", "perception", faithful, score)


def R(score: float | None = None) -> LabelledStep:  # noqa: N802
    return LabelledStep("So it is B.", "reasoning", None, score)


def chain(chain_id: str, *steps: LabelledStep) -> LabelledChain:
    # step texts are made unique per position so that the alignment check sees the same text in gold and pred
    fixed = [LabelledStep(f"{chain_id}-{i}", s.kind, s.faithful, s.score) for i, s in enumerate(steps)]
    return LabelledChain(chain_id, "q", fixed)


# ---------------------------------------------------------------------------------------------- UPR


def test_upr_pools_steps_over_chains() -> None:
    chains = [chain("a", P(True), P(False), R()), chain("b", P(True), P(None), R()), chain("c")]
    result = upr(chains)
    assert result.upr == 0.25
    assert (result.perception_steps, result.unfaithful_steps, result.chains, result.steps) == (4, 1, 3, 6)
    assert result.unlabelled_perception_steps == 1 and result.chains_with_unfaithful == 1
    assert result.upr_unlabelled_as_unfaithful == 0.5  # (1 + 1) / 4


def test_upr_edge_cases() -> None:
    none = upr([chain("a", R(), R())])
    assert none.upr is None and none.perception_steps == 0 and none.unfaithful_steps == 0
    assert upr([]).upr is None and upr([]).chains == 0
    assert upr([chain("a", P(False), P(False)), chain("b", P(False))]).upr == 1.0
    # an unfaithful label on a reasoning step is not an unfaithful perception step
    odd = LabelledChain("x", "q", [LabelledStep("t", "reasoning", False), LabelledStep("u", None, False)])
    assert upr([odd]).upr is None


# ----------------------------------------------------------------------------------------------- F1

GOLD = [chain("a", P(False), P(True), R(), P(True)), chain("b", P(False), P(True))]
PRED = [
    chain("a", P(False, 0.9), P(False, 0.8), R(0.1), P(None, 0.2)),
    chain("b", P(True, 0.3), P(True, 0.3)),
]


def test_f1_by_hand() -> None:
    # counted: a0 U, a1 F, a3 F, b0 U, b1 F (a2 is reasoning). predicted U: a0 (TP), a1 (FP);
    # a3 abstains (counts as not unfaithful: TN); b0 missed (FN); b1 TN.
    result = step_f1(GOLD, PRED)
    u, f = result.unfaithful, result.faithful
    assert (u.tp, u.fp, u.fn, u.support) == (1, 1, 1, 2)
    assert (u.precision, u.recall, u.f1) == (0.5, 0.5, 0.5)
    assert (f.tp, f.fp, f.fn, f.support) == (2, 1, 1, 3)
    assert f.precision == pytest.approx(2 / 3) and f.recall == pytest.approx(2 / 3) and f.f1 == pytest.approx(2 / 3)
    assert result.steps == 5 and result.chains == 2 and result.abstained == 1
    assert result.accuracy == pytest.approx(3 / 5)
    assert result.macro_f1 == pytest.approx((0.5 + 2 / 3) / 2)
    # positives .9, .3; negatives .8, .2, .3 -> pairs won 1+1+1+0+1+0.5 of 6
    assert result.auroc == pytest.approx(0.75) and result.scored_steps == 5
    as_json = result.to_dict()
    assert (as_json["precision"], as_json["recall"], as_json["f1"]) == (0.5, 0.5, 0.5)
    assert as_json["faithful"]["tp"] == 2 and as_json["unfaithful"]["support"] == 2


def test_f1_by_step_position() -> None:
    # i <= 2 (indices 0, 1): a0 TP, a1 FP, b0 FN, b1 TN; i > 2: a2 is reasoning, a3 an abstention (TN)
    buckets = f1_by_position(GOLD, PRED)
    early, late = buckets["i<=2"], buckets["i>2"]
    assert (early["precision"], early["recall"], early["f1"], early["steps"], early["support"]) == (0.5, 0.5, 0.5, 4, 2)
    assert early["auroc"] == pytest.approx(0.625)  # positives .9, .3 vs negatives .8, .3: 1 + 1 + 0 + 0.5 of 4
    assert (late["f1"], late["steps"], late["support"], late["auroc"]) == (None, 1, 0, None)
    only_first = step_f1(GOLD, PRED, positions=lambda index: index == 0)
    assert (only_first.unfaithful.tp, only_first.unfaithful.fn, only_first.steps) == (1, 1, 2)


def test_f1_when_the_class_is_never_predicted_or_never_present() -> None:
    missed = step_f1([chain("a", P(False), P(True))], [chain("a", P(True), P(True))])
    assert missed.unfaithful.precision is None and missed.unfaithful.recall == 0.0 and missed.unfaithful.f1 == 0.0
    clean = step_f1([chain("a", P(True), P(True))], [chain("a", P(True), P(True))])
    assert (clean.unfaithful.precision, clean.unfaithful.recall, clean.unfaithful.f1) == (None, None, None)
    assert clean.faithful.f1 == 1.0 and clean.accuracy == 1.0
    assert clean.auroc is None and clean.scored_steps == 0


def test_f1_all_unfaithful() -> None:
    gold = [chain("a", P(False), P(False))]
    result = step_f1(gold, [chain("a", P(False, 0.7), P(False, 0.7))])
    assert (result.unfaithful.precision, result.unfaithful.recall, result.unfaithful.f1) == (1.0, 1.0, 1.0)
    assert result.faithful.f1 is None  # no faithful step in gold or prediction
    assert result.auroc is None  # one class only


def test_f1_empty_chains_and_reasoning_predictions() -> None:
    empty = step_f1([chain("a"), chain("b")], [chain("a"), chain("b")])
    assert empty.steps == 0 and empty.chains == 2 and empty.accuracy is None and empty.unfaithful.f1 is None
    # the detector typed a gold perception step as reasoning: that is "not unfaithful", not an abstention
    typed = step_f1([chain("a", P(False))], [chain("a", R())])
    assert typed.unfaithful.fn == 1 and typed.abstained == 0


def test_f1_refuses_misaligned_files() -> None:
    with pytest.raises(MetricError, match=r"1 gold chain\(s\) have no prediction \(e.g. \['b'\]\)"):
        step_f1(GOLD, PRED[:1])
    with pytest.raises(MetricError, match=r"1 predicted chain\(s\) are not in the gold file"):
        step_f1(GOLD[:1], PRED)
    with pytest.raises(MetricError, match=r"chain 'a': gold has 4 steps, prediction 2"):
        step_f1(GOLD[:1], [chain("a", P(True), P(True))])
    other_text = [LabelledChain("a", "q", [LabelledStep("something else", "perception", True)])]
    with pytest.raises(MetricError, match=r"chain 'a', step 0: texts differ"):
        step_f1([chain("a", P(True))], other_text)
    assert step_f1([chain("a", P(True))], other_text, check_text=False).steps == 1


# -------------------------------------------------------------------------------------------- AUROC


def test_auroc_by_rank_with_ties() -> None:
    assert auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    assert auroc([0.5, 0.5, 0.5], [True, False, False]) == pytest.approx(0.5)
    assert auroc([0.9, 0.1], [False, True]) == 0.0
    assert auroc([0.2, 0.2], [True, True]) is None
    with pytest.raises(ValueError, match="differ in length"):
        auroc([0.1], [True, False])


# ---------------------------------------------------------------------------------------------- ICC


def test_icc_3_1_shrout_fleiss_example() -> None:
    # Shrout & Fleiss (1979), Table 2: six targets, four judges; ICC(3,1) = .71
    table = [[9, 2, 5, 8], [6, 1, 3, 2], [8, 4, 6, 8], [7, 1, 2, 6], [10, 5, 6, 9], [6, 2, 4, 7]]
    assert icc_3_1(table) == pytest.approx(0.7148, abs=5e-4)


def test_icc_3_1_small_cases() -> None:
    # MS_rows = 1.5, MS_error = 0.5 -> (1.5 - 0.5) / (1.5 + 0.5)
    assert icc_3_1([[1, 1], [2, 3], [3, 2]]) == pytest.approx(0.5)
    assert icc_3_1([[1, 2], [2, 3], [3, 4], [4, 5]]) == pytest.approx(1.0)  # consistency: a constant bias is fine
    assert icc_3_1([[2, 2], [2, 2]]) is None  # no variance at all
    assert icc_3_1([[1, 2]]) is None  # one subject
    with pytest.raises(ValueError, match="one rating per rater"):
        icc_3_1([[1, 2], [3]])


def test_icc_between_raters_on_per_chain_counts() -> None:
    a = [chain("x", P(True)), chain("y", P(True), P(False)), chain("z", P(True), P(True), P(False))]
    b = [chain("z", P(True), P(False)), chain("x", P(True)), chain("y", P(True), P(True), P(False))]
    result = icc_between(a, b)
    # perception counts by id: x 1/1, y 2/3, z 3/2 -> the [[1,1],[2,3],[3,2]] table above
    assert result.icc_perception == pytest.approx(0.5)
    # unfaithful counts: x 0/0, y 1/1, z 1/1 -> perfect agreement
    assert result.icc_unfaithful == pytest.approx(1.0)
    as_json = result.to_dict()
    assert (result.chains, as_json["perception_steps_a"], as_json["perception_steps_b"]) == (3, 6, 6)
    assert (as_json["unfaithful_steps_a"], as_json["unfaithful_steps_b"]) == (2, 2)
    with pytest.raises(MetricError, match=r"only in A \['y'\] \(1\), only in B \[\] \(0\)"):
        icc_between(a, b[:2])
    # a third rater identical to A: perception table [[1,1,1],[2,3,2],[3,2,3]]
    three = icc_between(a, b, a)
    assert three.raters == 3 and three.perception_steps_by_rater == [6, 6, 6]
    assert three.icc_perception == pytest.approx(icc_3_1([[1, 1, 1], [2, 3, 2], [3, 2, 3]]))
    assert three.icc_perception == pytest.approx(2 / 3)  # MS_rows 7/3, MS_error 1/3 -> (7/3 - 1/3) / (7/3 + 2/3)
    with pytest.raises(MetricError, match="only in rater 3"):
        icc_between(a, b, a[:1])
