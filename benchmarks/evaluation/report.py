"""The seed paper's analysis tables and plots, from labelled chains, traces and logprob records.

    Table 11 style   UPR and accuracy, vanilla vs corrected, one row per benchmark
    Table 4 style    detector swap: UPR and accuracy of corrected runs, one row per detector
    Table 3 style    detectors side by side: F1, precision, recall, AUROC (all, and by step position),
                     calls and latency, from `bench replay --json` reports
    Table 12 style   regeneration outcomes: steps fixed in 1, 2, ..., K tries, and failed after K
    FREAK curve      probability of the correct MCQ option after each reasoning step

`build_report(out_dir, ...)` writes `report.md` (the tables, Markdown), `report.json` (every number in
it) and one PNG per section (matplotlib, Agg backend). Each section is optional.

Inputs:
- UPR comes from labelled chains (labels by ground truth or by `bench judge-upr`). Accuracy counts a
  chain correct when its record says so (`"correct": true|false`, as benchmark runs write it), else
  when its `answer` matches `gold_answer` (`answers_match`: the same option letter, read from the
  reply by benchmarks/evaluation/mcq.py, or the same text);
  chains without a gold answer are left out of accuracy.
- Regeneration outcomes come from proxy traces, or from labelled chains converted from them (both keep
  each step's `attempts`, `original_text` and `residual_reason`).
- The FREAK curve comes from JSONL records {"id", "gold_answer": "B", "distractor": "C" (optional),
  "option_logprobs": [{"A": -2.1, "B": -0.4, ...}, ...]}: entry k holds the log-probabilities of the
  option letters when the answer is asked for after the first k steps (entry 0: before any step), e.g.
  vLLM's `top_logprobs` at the answer position. They are renormalised over the listed options. The
  curve is averaged by step index and, because chains differ in length, by relative position too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.labelled import LabelledChain
from faithproxy.benchmarks.evaluation.mcq import LETTERS, extract_choice
from faithproxy.benchmarks.evaluation.metrics import upr

# The paper's numbers (001, ThinkLite-VL-7B), for the "paper" columns: METHOD.md. Its accuracy is each
# benchmark's own headline figure, not accuracy per chain, so it is printed only beside a figure of the
# same definition: `acc_metric` is where that figure sits in a run's scores.json (`metrics`, a dotted
# path), `acc_scale` turns it into a fraction. The definitions are our reading of the paper: MMVP's
# official grader reports only pair accuracy; HallusionBench's per-question accuracy (aAcc); MMEvalPro's
# perception split, i.e. the perception questions' accuracy (auto_score.py's Micro_Average, percent).
PAPER_TABLE_11 = {
    "mmevalpro": {"upr_vanilla": 13.4, "upr_corrected": 4.8, "acc_vanilla": 78.7, "acc_corrected": 82.8,
                  "acc_metric": "Micro_Average.perception_score", "acc_scale": 0.01,
                  "acc_definition": "perception accuracy"},
    "hallusionbench": {"upr_vanilla": 22.0, "upr_corrected": 7.9, "acc_vanilla": 55.3, "acc_corrected": 64.3,
                       "acc_metric": "aAcc", "acc_scale": 1.0, "acc_definition": "aAcc (per question)"},
    "mmvp": {"upr_vanilla": 8.4, "upr_corrected": 1.7, "acc_vanilla": 35.0, "acc_corrected": 39.7,
             "acc_metric": "pair_accuracy", "acc_scale": 1.0, "acc_definition": "pair accuracy"},
}  # fmt: skip
PAPER_TABLE_12 = {"fixed": [2096, 794, 425], "failed": 2217}
PAPER_TABLE_3 = {"SAPLMA probe": 25.4, "HaloScope": 14.9, "kNN": 8.9, "prompting": 30.8, "auxiliary model": 97.8}

# ------------------------------------------------------------------------------------------ accuracy


def _norm(text: str) -> str:
    return " ".join(text.lower().replace(".", " ").split())


def answers_match(answer: str | None, gold: str) -> bool:
    """Same option letter (when gold is one) or the same text, ignoring case, periods and spacing."""
    if answer is None:
        return False
    if re.fullmatch(r"\s*\(?[A-Za-z]\)?\s*", gold):
        letter = gold.strip().strip("()").upper()
        return extract_choice(answer, n_options=max(4, LETTERS.index(letter) + 1)) == letter
    return _norm(answer) == _norm(gold)


def accuracy(chains: Sequence[LabelledChain]) -> tuple[float | None, int]:
    """(share correct, chains scored): a record's own "correct" wins over answer matching."""
    scored = correct = 0
    for chain in chains:
        verdict = chain.extra.get("correct")
        if isinstance(verdict, bool):
            scored, correct = scored + 1, correct + verdict
        elif chain.gold_answer is not None:
            scored += 1
            correct += answers_match(chain.answer, chain.gold_answer)
    return (correct / scored if scored else None), scored


# ------------------------------------------------------------------------------------------ sections


@dataclass(frozen=True)
class Row:
    name: str
    upr: float | None
    perception_steps: int
    unfaithful_steps: int
    accuracy: float | None
    scored: int
    chains: int


def row_of(name: str, chains: Sequence[LabelledChain]) -> Row:
    u = upr(chains)
    acc, scored = accuracy(chains)
    return Row(name, u.upr, u.perception_steps, u.unfaithful_steps, acc, scored, len(chains))


@dataclass(frozen=True)
class Outcomes:
    """Regeneration outcomes over rewritten steps (Table 12)."""

    invoked: int
    fixed_by_attempt: dict[int, int]  # attempts -> steps fixed with that many tries
    failed: int
    failed_by_attempt: dict[int, int] = field(default_factory=dict)

    @property
    def fixed(self) -> int:
        return sum(self.fixed_by_attempt.values())


def regeneration_outcomes(records: Iterable[Mapping[str, Any]]) -> Outcomes:
    """From trace records or labelled-chain dicts: every step with attempts ≥ 1 was sent to regeneration."""
    fixed: dict[int, int] = {}
    failed: dict[int, int] = {}
    for record in records:
        for step in record.get("steps") or []:
            attempts = int(step.get("attempts") or 0)
            if attempts < 1:
                continue
            if step.get("original_text") is not None:
                fixed[attempts] = fixed.get(attempts, 0) + 1
            else:
                failed[attempts] = failed.get(attempts, 0) + 1
    invoked = sum(fixed.values()) + sum(failed.values())
    return Outcomes(invoked, dict(sorted(fixed.items())), sum(failed.values()), dict(sorted(failed.items())))


def option_probabilities(logprobs: Mapping[str, float]) -> dict[str, float]:
    """Log-probabilities of the option letters renormalised into probabilities over those options."""
    if not logprobs:
        return {}
    top = max(logprobs.values())
    weights = {k.strip().upper(): math.exp(v - top) for k, v in logprobs.items()}
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}


@dataclass(frozen=True)
class Curve:
    """Mean probability of the correct option (and of the distractor) by step, and by relative position."""

    by_step: list[tuple[int, float, float | None, int]]  # (step k, mean P(gold), mean P(distractor), chains)
    by_position: list[tuple[float, float, int]]  # (bin centre in [0, 1], mean P(gold), points)
    chains: int


def freak_curve(records: Sequence[Mapping[str, Any]], bins: int = 10) -> Curve:
    gold_at: dict[int, list[float]] = {}
    distractor_at: dict[int, list[float]] = {}
    position: dict[int, list[float]] = {}
    used = 0
    for record in records:
        gold = str(record.get("gold_answer") or "").strip().upper()
        series = record.get("option_logprobs") or []
        if not gold or not series:
            continue
        used += 1
        distractor = str(record.get("distractor") or "").strip().upper() or None
        last = max(len(series) - 1, 1)
        for k, logprobs in enumerate(series):
            probs = option_probabilities(logprobs)
            p = probs.get(gold, 0.0)
            gold_at.setdefault(k, []).append(p)
            if distractor is not None:
                distractor_at.setdefault(k, []).append(probs.get(distractor, 0.0))
            b = min(int(k / last * bins), bins - 1)
            position.setdefault(b, []).append(p)
    by_step = [
        (k, _mean(gold_at[k]), _mean(distractor_at[k]) if k in distractor_at else None, len(gold_at[k]))
        for k in sorted(gold_at)
    ]
    by_position = [((b + 0.5) / bins, _mean(position[b]), len(position[b])) for b in sorted(position)]
    return Curve(by_step, by_position, used)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


# ------------------------------------------------------------------------------------------ markdown


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def paper_row(name: str) -> dict[str, Any] | None:
    return PAPER_TABLE_11.get(name.lower().replace("-", "").replace("_", ""))


def scores_beside(chains_path: str | Path) -> dict[str, Any] | None:
    """The scores.json `bench run` wrote next to a chains file (the same run), or None."""
    path = Path(chains_path).parent / "scores.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def paper_figure(name: str, scores: Mapping[str, Any] | None) -> float | None:
    """From a run's scores, the figure of the definition the paper's accuracy has (a fraction), or None."""
    paper = paper_row(name)
    if paper is None or not scores:
        return None
    value: Any = scores.get("metrics")
    for key in paper["acc_metric"].split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value * paper["acc_scale"] if isinstance(value, int | float) else None


def table_11(
    pairs: Sequence[tuple[str, Row, Row]], figures: Sequence[tuple[float | None, float | None]] = ()
) -> list[str]:
    """UPR and per-chain accuracy, vanilla vs corrected; then the paper's accuracy, beside our figure of its
    definition only (from the runs' scores.json): per-chain accuracy is not what the paper reports."""
    rows = []
    for k, (name, vanilla, corrected) in enumerate(pairs):
        paper = paper_row(name)
        ours = figures[k] if k < len(figures) else (None, None)
        comparable = paper is not None and None not in ours
        rows.append([
            name,
            f"{pct(vanilla.upr)} ({vanilla.unfaithful_steps}/{vanilla.perception_steps})",
            f"{pct(corrected.upr)} ({corrected.unfaithful_steps}/{corrected.perception_steps})",
            pct(vanilla.accuracy),
            pct(corrected.accuracy),
            f"{vanilla.chains} / {corrected.chains}",
            f"{paper['upr_vanilla']} → {paper['upr_corrected']}" if paper else "–",
            paper["acc_definition"] if paper else "–",
            f"{pct(ours[0])} → {pct(ours[1])}" if comparable else "–",
            f"{paper['acc_vanilla']} → {paper['acc_corrected']}" if comparable else "–",
        ])  # fmt: skip
    header = ["benchmark", "UPR % vanilla", "UPR % corrected", "acc % vanilla (per chain)",
              "acc % corrected (per chain)", "chains", "paper UPR %", "paper's accuracy figure", "ours %",
              "paper %"]  # fmt: skip
    return _table(header, rows)


def table_4(rows: Sequence[Row]) -> list[str]:
    header = ["detector", "UPR %", "unfaithful / perception steps", "acc %", "chains"]
    return _table(
        header,
        [[r.name, pct(r.upr), f"{r.unfaithful_steps} / {r.perception_steps}", pct(r.accuracy), r.chains] for r in rows],
    )


def table_12(outcomes: Outcomes) -> list[str]:
    rows = []
    for attempts, count in outcomes.fixed_by_attempt.items():
        share = count / outcomes.invoked if outcomes.invoked else None
        rows.append([f"fixed in {attempts} {'try' if attempts == 1 else 'tries'}", count, pct(share)])
    failed_share = outcomes.failed / outcomes.invoked if outcomes.invoked else None
    rows.append(["failed after all tries", outcomes.failed, pct(failed_share)])
    rows.append(["regeneration invoked", outcomes.invoked, "100.0" if outcomes.invoked else "–"])
    return _table(["outcome", "steps", "% of invoked"], rows)


def table_3(reports: Sequence[Mapping[str, Any]]) -> list[str]:
    """Detectors side by side, from `bench replay --json` reports (F1 on the unfaithful class)."""
    rows = []
    for r in reports:
        f1 = r.get("f1") or {}
        by_position = r.get("f1_by_position") or {}
        name = str(r.get("detector")) + (f" ({r['judge']})" if r.get("judge") else "")
        rows.append([
            name,
            pct(f1.get("f1")),
            pct(f1.get("precision")),
            pct(f1.get("recall")),
            pct(f1.get("auroc")),
            pct((by_position.get("i<=2") or {}).get("f1")),
            pct((by_position.get("i>2") or {}).get("f1")),
            r.get("detector_calls", "–"),
            "–" if r.get("judge_calls") is None else r["judge_calls"],
            "–" if r.get("latency_p50_s") is None else f"{1000 * r['latency_p50_s']:.0f}",
            f1.get("steps", "–"),
        ])  # fmt: skip
    header = ["detector", "F1 %", "precision %", "recall %", "AUROC %", "F1 % i≤2", "F1 % i>2", "detector calls",
              "judge calls", "p50 ms / call", "steps"]  # fmt: skip
    return _table(header, rows)


def curve_table(curve: Curve) -> list[str]:
    rows = [[k, f"{p:.3f}", "–" if d is None else f"{d:.3f}", n] for k, p, d, n in curve.by_step]
    return _table(["after step", "P(correct option)", "P(distractor)", "chains"], rows)


# ---------------------------------------------------------------------------------------------- plots


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(
    path: Path, labels: Sequence[str], series: Mapping[str, Sequence[float | None]], ylabel: str, title: str
) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(labels) + 2), 3.2))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [x + i * width for x in range(len(labels))]
        ax.bar(xs, [100 * v if v is not None else 0.0 for v in values], width, label=name)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))], labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_curve(path: Path, curve: Curve) -> None:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    steps = [k for k, _, _, _ in curve.by_step]
    left.plot(steps, [p for _, p, _, _ in curve.by_step], marker="o", label="correct option")
    if any(d is not None for _, _, d, _ in curve.by_step):
        left.plot(steps, [d if d is not None else math.nan for _, _, d, _ in curve.by_step], marker="s",
                  label="distractor")  # fmt: skip
        left.legend()
    left.set_xlabel("reasoning steps so far")
    left.set_ylabel("probability")
    left.set_ylim(0, 1)
    right.plot([c for c, _, _ in curve.by_position], [p for _, p, _ in curve.by_position], marker="o")
    right.set_xlabel("relative position in the chain")
    right.set_ylim(0, 1)
    fig.suptitle("P(correct option) along the chain")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------------------------- report


def build_report(
    out_dir: str | Path,
    *,
    pairs: Sequence[tuple[str, Sequence[LabelledChain], Sequence[LabelledChain]]] = (),
    swap: Sequence[tuple[str, Sequence[LabelledChain]]] = (),
    regeneration: Sequence[Mapping[str, Any]] = (),
    logprobs: Sequence[Mapping[str, Any]] = (),
    detectors: Sequence[Mapping[str, Any]] = (),
    title: str = "faithproxy benchmark report",
    pair_scores: Sequence[tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]] = (),
) -> dict[str, Any]:
    """Writes report.md, report.json and the plots of the sections given; returns report.json's content.
    `pair_scores` (aligned with `pairs`): the scores.json of each pair's vanilla and corrected runs, for
    the paper's accuracy figure of the same definition."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = [f"# {title}", ""]
    data: dict[str, Any] = {"files": {}}
    if pairs:
        rows = [(name, row_of(name, v), row_of(name, c)) for name, v, c in pairs]
        scored = list(pair_scores) + [(None, None)] * (len(rows) - len(pair_scores))
        figures = [(paper_figure(n, sv), paper_figure(n, sc)) for (n, _, _), (sv, sc) in zip(rows, scored, strict=True)]
        md += [
            "## UPR and accuracy, vanilla vs corrected (Table 11 style)",
            "",
            *table_11(rows, figures),
            "",
            "The paper's accuracy is each benchmark's own figure; it is shown only beside our figure of the same "
            "definition, read from the runs' scores.json (`bench run` writes it next to chains.jsonl).",
            "",
        ]
        data["table_11"] = [
            {"benchmark": n, "vanilla": v.__dict__, "corrected": c.__dict__,
             "paper_figure": {"definition": (paper_row(n) or {}).get("acc_definition"), "vanilla": fv,
                              "corrected": fc}}
            for (n, v, c), (fv, fc) in zip(rows, figures, strict=True)
        ]  # fmt: skip
        plot = out / "upr_vanilla_vs_corrected.png"
        names = [n for n, _, _ in rows]
        _bars(plot, names, {"vanilla": [v.upr for _, v, _ in rows], "corrected": [c.upr for _, _, c in rows]},
              "UPR %", "Unfaithful perception rate")  # fmt: skip
        md += [f"![UPR vanilla vs corrected]({plot.name})", ""]
        data["files"]["table_11"] = plot.name
    if swap:
        rows4 = [row_of(name, chains) for name, chains in swap]
        md += ["## Detector swap (Table 4 style)", "", *table_4(rows4), ""]
        data["table_4"] = [r.__dict__ for r in rows4]
        plot = out / "detector_swap.png"
        _bars(plot, [r.name for r in rows4], {"UPR": [r.upr for r in rows4], "accuracy": [r.accuracy for r in rows4]},
              "%", "Detector swap")  # fmt: skip
        md += [f"![detector swap]({plot.name})", ""]
        data["files"]["table_4"] = plot.name
    if detectors:
        md += ["## Detectors against the same labels (Table 3 style, unfaithful class)", "", *table_3(detectors), ""]
        paper = ", ".join(f"{k} {v}" for k, v in PAPER_TABLE_3.items())
        md += [f"Paper, F1 % against a strong judge's labels: {paper}.", ""]
        data["table_3"] = [dict(r) for r in detectors]
        plot = out / "detector_f1.png"
        names = [str(r.get("detector")) + (f"/{r['judge']}" if r.get("judge") else "") for r in detectors]
        _bars(plot, names, {"F1 (unfaithful)": [(r.get("f1") or {}).get("f1") for r in detectors]}, "F1 %",
              "Detector F1")  # fmt: skip
        md += [f"![detector F1]({plot.name})", ""]
        data["files"]["table_3"] = plot.name
    if regeneration:
        outcomes = regeneration_outcomes(regeneration)
        md += ["## Regeneration outcomes (Table 12 style)", "", *table_12(outcomes), ""]
        paper = PAPER_TABLE_12
        md += [f"Paper, over 5,532 invoked: fixed in 1/2/3 tries {paper['fixed'][0]}/{paper['fixed'][1]}/"
               f"{paper['fixed'][2]}, failed after 3 tries {paper['failed']}.", ""]  # fmt: skip
        data["table_12"] = {
            "invoked": outcomes.invoked,
            "fixed_by_attempt": outcomes.fixed_by_attempt,
            "fixed": outcomes.fixed,
            "failed": outcomes.failed,
            "failed_by_attempt": outcomes.failed_by_attempt,
        }
        plot = out / "regeneration_outcomes.png"
        labels = [f"fixed@{k}" for k in outcomes.fixed_by_attempt] + ["failed"]
        counts = [*outcomes.fixed_by_attempt.values(), outcomes.failed]
        shares = [c / outcomes.invoked if outcomes.invoked else 0.0 for c in counts]
        _bars(plot, labels, {"share of invoked": shares}, "% of invoked", "Regeneration outcomes")
        md += [f"![regeneration outcomes]({plot.name})", ""]
        data["files"]["table_12"] = plot.name
    if logprobs:
        curve = freak_curve(logprobs)
        md += ["## Probability of the correct option along the chain (FREAK style)", "", *curve_table(curve), ""]
        data["curve"] = {"by_step": curve.by_step, "by_position": curve.by_position, "chains": curve.chains}
        if curve.by_step:
            plot = out / "option_probability.png"
            _plot_curve(plot, curve)
            md += [f"![P(correct option)]({plot.name})", ""]
            data["files"]["curve"] = plot.name
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")
    (out / "report.json").write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return data
