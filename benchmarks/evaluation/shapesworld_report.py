"""Reports of `faithproxy bench shapesworld` from its result JSON: the Markdown report, the README's
table, the issue's goals, and the plot.

The README's ShapesWorld table is this module's `readme_table` of the committed result
(benchmarks/results/shapesworld-all.json: every row, from runs merged by shapesworld_merge), between
the two `README_MARKERS`; a test keeps the two equal, so the README's figures are always the
committed runs'. Print it with
`faithproxy bench shapesworld --readme-table benchmarks/results/shapesworld-all.json`.
Wall times are given as multiples of vanilla's: the machine is shared, so only ratios within one run
mean anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

README_MARKERS = ("<!-- shapesworld-detectors table: begin -->", "<!-- shapesworld-detectors table: end -->")

# The goals (issue 21), reported met or not with the figures; never tuned.
LEARNED_UPR_REDUCTION = 0.60
CASCADE_CALLS_SAVED = 0.50
CASCADE_F1_POINTS = 2.0
CASCADE_RESIDUAL_POINTS = 2.0
PROBE_F1 = 0.60
# Issue 32's goals for a row with a flag threshold (`judge:learned@T`, T chosen on validation chains).
THRESHOLD_PRECISION = 0.45
THRESHOLD_RECALL = 0.60
THRESHOLD_UPR_REDUCTION = 0.55
THRESHOLD_FALSE_TRIES_SHARE = 1 / 3  # of the same detector's false-flag tries without a threshold


def _row(result: dict[str, Any], detector: str, judge: str | None) -> dict[str, Any] | None:
    """The row of that detector and judge without a flag threshold."""
    return next(
        (
            d
            for d in result["detectors"].values()
            if d.get("detector") == detector and d.get("judge") == judge and d.get("flag_threshold") is None
        ),
        None,
    )


def threshold_goals(result: dict[str, Any]) -> dict[str, Any]:
    """Issue 32's goals for each row with a flag threshold, against vanilla and against the same detector
    and judge without one (when the result has that row)."""
    out: dict[str, Any] = {}
    vanilla = result["vanilla"]
    for name, d in result["detectors"].items():
        if d.get("flag_threshold") is None:
            continue
        g = d["detector_vs_ground_truth"]
        base = _row(result, d["detector"], d["judge"])
        tries = d["false_flags"]["regeneration_tries"]
        base_tries = base["false_flags"]["regeneration_tries"] if base is not None else None
        entry: dict[str, Any] = {
            "flag_threshold": d["flag_threshold"],
            "precision": g["precision"],
            "recall": g["recall"],
            "upr_reduction": d["upr_reduction_vs_vanilla"],
            "accuracy_vanilla": vanilla["accuracy"],
            "accuracy_corrected": d["corrected"]["accuracy"],
            "false_flag_tries": tries,
            "false_flag_tries_without_threshold": base_tries,
            "wall_vs_vanilla": round(d["wall_s"] / d.get("vanilla_wall_s", vanilla["wall_s"]), 2),
            "judge_calls": d["judge_bill"]["calls"],
        }
        entry["met"] = {
            "precision_at_recall": g["precision"] >= THRESHOLD_PRECISION and g["recall"] >= THRESHOLD_RECALL,
            "upr_reduction": d["upr_reduction_vs_vanilla"] >= THRESHOLD_UPR_REDUCTION,
            "accuracy": d["corrected"]["accuracy"] >= vanilla["accuracy"],
            "false_flag_tries": None if base_tries is None else tries <= THRESHOLD_FALSE_TRIES_SHARE * base_tries,
        }
        out[name] = entry
    return out


def goals(result: dict[str, Any]) -> dict[str, Any]:
    """Each goal whose rows the run has: the figures, the target and whether it is met."""
    out: dict[str, Any] = {}
    vanilla = result["vanilla"]
    learned = _row(result, "judge", "learned")
    if learned is not None:
        reduction = learned["upr_reduction_vs_vanilla"]
        out["learned_judge"] = {
            "upr_vanilla": vanilla["upr"],
            "upr_residual": learned["corrected"]["upr"],
            "upr_reduction": reduction,
            "target_reduction": LEARNED_UPR_REDUCTION,
            "accuracy_vanilla": vanilla["accuracy"],
            "accuracy_corrected": learned["corrected"]["accuracy"],
            "met": reduction >= LEARNED_UPR_REDUCTION and learned["corrected"]["accuracy"] >= vanilla["accuracy"],
        }
    cascade = _row(result, "cascade", "learned")
    if learned is not None and cascade is not None:
        calls, alone = cascade["judge_bill"]["calls"], learned["judge_bill"]["calls"]
        saved = round(1 - calls / alone, 4) if alone else 0.0
        lost = round(100 * (learned["detector_vs_ground_truth"]["f1"] - cascade["detector_vs_ground_truth"]["f1"]), 2)
        apart = round(100 * abs(cascade["corrected"]["upr"] - learned["corrected"]["upr"]), 2)
        out["cascade"] = {
            "judge_calls": calls,
            "judge_calls_judge_alone": alone,
            "calls_saved": saved,
            "target_calls_saved": CASCADE_CALLS_SAVED,
            "f1_points_lost": lost,
            "target_f1_points": CASCADE_F1_POINTS,
            "residual_upr_points_from_judge": apart,
            "target_residual_points": CASCADE_RESIDUAL_POINTS,
            "met": saved >= CASCADE_CALLS_SAVED and lost <= CASCADE_F1_POINTS and apart <= CASCADE_RESIDUAL_POINTS,
        }
    probe = _row(result, "probe", None)
    if probe is not None:
        f1 = probe["detector_vs_ground_truth"]["f1"]
        out["probe"] = {"f1": f1, "target_f1": PROBE_F1, "met": f1 >= PROBE_F1}
    thresholded = threshold_goals(result)
    if thresholded:
        out["flag_thresholds"] = thresholded
    return out


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The top-level figures: vanilla's, and the corrected ones of the row with the lowest residual."""
    vanilla = result["vanilla"]
    best = min(result["detectors"].values(), key=lambda d: d["corrected"]["upr"], default=None)
    return {
        "upr_vanilla": vanilla["upr"],
        "upr_residual": best["corrected"]["upr"] if best else None,
        "accuracy_vanilla": vanilla["accuracy"],
        "accuracy_corrected": best["corrected"]["accuracy"] if best else None,
        "perception_error_rate": vanilla["upr"],
    }


def _ratio_text(wall: float, vanilla: float) -> str:
    return f"{wall / vanilla:.1f}×" if vanilla else "–"


def readme_table(result: dict[str, Any]) -> str:
    """The README's table: one line per configuration, vanilla first (ends with a newline)."""
    v = result["vanilla"]
    lines = [
        "| configuration | UPR first draft | detected | residual | accuracy | P / R / F1 | false flags: tries, "
        "answers changed (right→wrong / wrong→right) | judge calls | judge tokens in / cached / out | wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| vanilla | {v['upr']:.3f} | – | {v['upr']:.3f} | {v['accuracy']:.3f} | – | – | – | – | 1.0× |",
    ]
    for name, d in result["detectors"].items():
        g, f, b = d["detector_vs_ground_truth"], d["false_flags"], d["judge_bill"]
        bill = f"{b['input_tokens']:,} / {b['cached_input_tokens']:,} / {b['output_tokens']:,}" if b["calls"] else "–"
        lines.append(
            f"| {name} | {d['upr_first_draft']:.3f} | {d['upr_detected']:.3f} | {d['corrected']['upr']:.3f} | "
            f"{d['corrected']['accuracy']:.3f} | {g['precision']:.2f} / {g['recall']:.2f} / {g['f1']:.2f} | "
            f"{f['regeneration_tries']}, {f['answers_changed']} ({f['right_to_wrong']} / {f['wrong_to_right']}) | "
            f"{b['calls'] or '–'} | {bill} | {_ratio_text(d['wall_s'], d.get('vanilla_wall_s', v['wall_s']))} |"
        )
    return "\n".join(lines) + "\n"


def readme_block(result: dict[str, Any]) -> str:
    """The table between its markers, as it stands in the README."""
    return f"{README_MARKERS[0]}\n{readme_table(result)}{README_MARKERS[1]}"


def readme_section(readme: str) -> str | None:
    """The marked block in a README's text (markers included), or None when it has none."""
    begin, end = README_MARKERS
    start = readme.find(begin)
    stop = readme.find(end, start)
    return None if start < 0 or stop < 0 else readme[start : stop + len(end)]


def _change(share: float, down: str, up: str) -> str:
    """A relative change in words: 0.25 → '25% lower', -0.06 → '6% higher'."""
    return f"{100 * share:.0f}% {down}" if share >= 0 else f"{-100 * share:.0f}% {up}"


def _points(lost: float) -> str:
    return f"{lost:.1f} points lost" if lost >= 0 else f"{-lost:.1f} points gained"


def _goal_lines(result: dict[str, Any]) -> list[str]:
    g = result.get("goals") or goals(result)
    lines = []
    if "learned_judge" in g:
        x = g["learned_judge"]
        lines.append(
            f"- learned judge: residual UPR {x['upr_vanilla']:.3f} → {x['upr_residual']:.3f} "
            f"({_change(x['upr_reduction'], 'lower', 'higher')}; goal ≥ {100 * x['target_reduction']:.0f}% lower), "
            "accuracy "
            f"{x['accuracy_vanilla']:.3f} → {x['accuracy_corrected']:.3f} (goal: not lower): "
            f"**{'met' if x['met'] else 'not met'}**"
        )
    if "cascade" in g:
        x = g["cascade"]
        lines.append(
            f"- cascade: {x['judge_calls']} learned-judge calls against {x['judge_calls_judge_alone']} "
            f"({_change(x['calls_saved'], 'fewer', 'more')}; goal ≥ {100 * x['target_calls_saved']:.0f}% fewer), "
            f"F1 {_points(x['f1_points_lost'])} (goal: at most {x['target_f1_points']:.0f} points lost), residual UPR "
            f"{x['residual_upr_points_from_judge']:.1f} points from the judge row (goal ≤ "
            f"{x['target_residual_points']:.0f}): **{'met' if x['met'] else 'not met'}**"
        )
    if "probe" in g:
        x = g["probe"]
        lines.append(
            f"- probe: F1 {x['f1']:.3f} on held-out chains (goal ≥ {x['target_f1']:.2f}): "
            f"**{'met' if x['met'] else 'not met'}**"
        )
    for name, x in (g.get("flag_thresholds") or {}).items():
        lines.append(_threshold_line(name, x))
    return lines


def _met(flag: bool | None) -> str:
    return "no row to compare" if flag is None else "met" if flag else "not met"


def _threshold_line(name: str, x: dict[str, Any]) -> str:
    met = x["met"]
    base = x["false_flag_tries_without_threshold"]
    base_text = "–" if base is None else str(base)
    return (
        f"- {name}: P {x['precision']:.2f} at R {x['recall']:.2f} (goal P ≥ {THRESHOLD_PRECISION} at R ≥ "
        f"{THRESHOLD_RECALL}: **{_met(met['precision_at_recall'])}**); residual UPR "
        f"{_change(x['upr_reduction'], 'lower', 'higher')} than vanilla (goal ≥ {100 * THRESHOLD_UPR_REDUCTION:.0f}%: "
        f"**{_met(met['upr_reduction'])}**); accuracy {x['accuracy_vanilla']:.3f} → {x['accuracy_corrected']:.3f} "
        f"(**{_met(met['accuracy'])}**); false-flag tries {x['false_flag_tries']} against {base_text}"
        f" without a threshold (goal ≤ one third: **{_met(met['false_flag_tries'])}**); "
        f"{x['judge_calls']} judge calls; wall {x['wall_vs_vanilla']:.1f}× vanilla"
    )


def markdown(result: dict[str, Any]) -> str:
    v = result["vanilla"]
    detectors = result["detectors"]
    lines = [
        f"# ShapesWorld: vanilla vs faithproxy ({result['n_chains']} held-out chains, scenes' seed "
        f"{result['scenes_seed']})",
        "",
        "UPR and accuracy by ground truth (Table 11 style):",
        "",
        "| configuration | UPR first draft | UPR detected | UPR residual | accuracy | right option text | wall s |",
        "|---|---|---|---|---|---|---|",
        f"| vanilla (vLLM alone) | {v['upr']:.3f} | – | {v['upr']:.3f} | {v['accuracy']:.3f} | "
        f"{v['option_text_correct']:.3f} | {v['wall_s']:.1f} |",
    ]
    for name, d in detectors.items():
        c = d["corrected"]
        lines.append(
            f"| faithproxy, {name} | {d['upr_first_draft']:.3f} | {d['upr_detected']:.3f} | {c['upr']:.3f} | "
            f"{c['accuracy']:.3f} | {c['option_text_correct']:.3f} | {d['wall_s']:.1f} |"
        )
    lines += ["", "Detectors against ground truth on the first drafts (Table 4 style):", ""]
    lines += ["| detector | precision | recall | F1 | flagged share | unchecked steps |", "|---|---|---|---|---|---|"]
    for name, d in detectors.items():
        g = d["detector_vs_ground_truth"]
        unchecked = ", ".join(f"{k}: {n}" for k, n in (d.get("unchecked_steps") or {}).items()) or "0"
        lines.append(
            f"| {name} | {g['precision']:.3f} | {g['recall']:.3f} | {g['f1']:.3f} | {d['upr_detected']:.3f} | "
            f"{unchecked} |"
        )
    if any("false_flags" in d for d in detectors.values()):
        lines += ["", "False flags (true first drafts flagged) and answers against vanilla's for the same scene:", ""]
        lines += [
            "| detector | false flags | their regeneration tries | rewritten | answers changed by them (right→wrong "
            "/ wrong→right) | all answers changed (right→wrong / wrong→right) | regenerations (all) |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, d in detectors.items():
            f, a = d["false_flags"], d["answers_vs_vanilla"]
            lines.append(
                f"| {name} | {f['steps']} | {f['regeneration_tries']} | {f['steps_rewritten']} | "
                f"{f['answers_changed']} ({f['right_to_wrong']} / {f['wrong_to_right']}) | "
                f"{a['answers_changed']} ({a['right_to_wrong']} / {a['wrong_to_right']}) | {d['regenerations']} |"
            )
        lines += ["", "The judge's bill (tokens as the judge reported them; input = fresh prompt tokens):", ""]
        lines += [
            "| detector | judge calls | input | cached input | output | descriptions | cascade: probe / judge decide |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, d in detectors.items():
            b = d["judge_bill"]
            stages = d.get("cascade_decisions")
            decided = f"{stages.get('probe', 0)} / {stages.get('judge', 0)}" if stages else "–"
            lines.append(
                f"| {name} | {b['calls']} | {b['input_tokens']:,} | {b['cached_input_tokens']:,} | "
                f"{b['output_tokens']:,} | {b['descriptions']} | {decided} |"
            )
        lines += ["", "Where each detector errs on first-draft perception steps, by step type (tp / fp / fn / tn)", ""]
        types = sorted({t for d in detectors.values() for t in d["errors_by_kind"]["by_step_type"]})
        lines += ["| detector | " + " | ".join(types) + " | missed, by what the sentence got wrong |"]
        lines += ["|---|" + "---|" * (len(types) + 1)]
        for name, d in detectors.items():
            e = d["errors_by_kind"]
            cells = []
            for t in types:
                c = e["by_step_type"].get(t)
                cells.append(f"{c['tp']} / {c['fp']} / {c['fn']} / {c['tn']}" if c else "–")
            missed = ", ".join(f"{k}: {n}" for k, n in e["missed_by_error_kind"].items()) or "none"
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {missed} |")
    lines += ["", "Regeneration outcomes of flagged steps (Table 12 style):", ""]
    for name, d in detectors.items():
        outcomes = ", ".join(f"{k}: {n}" for k, n in d["regeneration_outcomes"].items()) or "none flagged"
        lines.append(f"- {name}: {outcomes}; accepted fixes true by ground truth: "
                     f"{d['accepted_fixes_true_by_ground_truth']:.3f}")  # fmt: skip
    goal_lines = _goal_lines(result)
    if goal_lines:
        lines += ["", "Goals (issue 21):", "", *goal_lines]
    models = result.get("models")
    if models:
        lines += ["", "Models (sha256 of the weights file, or of the probe file):", ""]
        for role, m in models.items():
            lines.append(f"- {role}: `{m['path']}` {m['sha256']}")
    if result.get("left_out"):
        lines += ["", "Rows left out: " + "; ".join(f"{k} ({why})" for k, why in result["left_out"].items())]
    if result.get("runs"):  # a merged result (shapesworld_merge): each part's own command
        lines += ["", "Merged from runs over the same scenes (`faithproxy bench shapesworld --merge`):", ""]
        lines += [f"- {', '.join(r['rows'])}: `{r['command']}`" for r in result["runs"]]
    if result.get("command"):
        lines += ["", f"Reproduce: `{result['command']}`"]
    lines.append("")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Three panels: UPR by ground truth, accuracy, and regeneration outcomes per detector."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    detectors = result["detectors"]
    names = ["vanilla", *detectors]
    fig, (upr, acc, regen) = plt.subplots(1, 3, figsize=(4 + 2.2 * len(names), 3.8))
    residual = [result["vanilla"]["upr"], *(d["corrected"]["upr"] for d in detectors.values())]
    drafts = [result["vanilla"]["upr"], *(d["upr_first_draft"] for d in detectors.values())]
    xs = range(len(names))
    upr.bar([x - 0.2 for x in xs], drafts, 0.4, label="first draft")
    upr.bar([x + 0.2 for x in xs], residual, 0.4, label="returned (residual)")
    upr.set_xticks(list(xs), names, rotation=20, fontsize=8)
    upr.set_title("UPR by ground truth")
    upr.set_ylim(0, 1.2)
    upr.legend(fontsize=8, loc="upper right")
    acc.bar(names, [result["vanilla"]["accuracy"], *(d["corrected"]["accuracy"] for d in detectors.values())])
    acc.set_ylim(0, 1)
    acc.tick_params(axis="x", rotation=20, labelsize=8)
    acc.set_title("answer accuracy")
    keys = sorted({k for d in detectors.values() for k in d["regeneration_outcomes"]})
    width = 0.8 / max(len(detectors), 1)
    for i, (name, d) in enumerate(detectors.items()):
        regen.bar([k + i * width for k in range(len(keys))], [d["regeneration_outcomes"].get(k, 0) for k in keys],
                  width, label=name)  # fmt: skip
    regen.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))], [k.replace("_", " ") for k in keys],
                     rotation=20, fontsize=8)  # fmt: skip
    regen.set_title("flagged steps: outcome")
    regen.legend(fontsize=8)
    fig.suptitle(f"ShapesWorld, {result['n_chains']} held-out chains")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
