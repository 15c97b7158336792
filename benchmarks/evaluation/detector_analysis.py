"""Why the detectors a team can run are wrong: each signal per claim kind, its reliability, and the
rewrites the judge refused that were true. Development seeds only.

    python -m faithproxy.benchmarks.evaluation.detector_analysis --seed 997 --n 100 \
        --signal benchmarks/results/consistency/signal-997.json \
        --out benchmarks/results/analysis/detectors-997.json

Runs `faithproxy bench shapesworld` with the rows `judge:learned` (no flag threshold, so that every flag
and its confidence is in the traces) and `probe` (a score on every perception step), then reads the
traces against ground truth:

- per step type (count, absence, object in cell, object, relation): precision and recall of the learned
  judge's flags, of the probe at its file's threshold, and of the consistency share (from a
  `consistency_signal` file, same seed) at 2 of 8 samples against; AUROC of the probe score and of the
  consistency share;
- reliability: the judge's confidence on its flags, and the probe's score on every step, in bins, against
  the observed share of false steps (a PNG beside the result);
- the rewrites the judge refused: how many were true by ground truth, per step type.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.consistency_signal import auroc
from faithproxy.benchmarks.evaluation.provenance import load_now, run_record
from faithproxy.benchmarks.evaluation.shapesworld_rows import row_replies, step_type
from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_sentence
from faithproxy.benchmarks.shapesworld.dataset import Item
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items

ROWS = ("judge:learned", "probe")
BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0001)


def _pr(pairs: Sequence[tuple[bool, bool]]) -> dict[str, Any]:
    """(flagged, false) pairs → counts, precision, recall."""
    tp = sum(f and y for f, y in pairs)
    flags, false = sum(f for f, _ in pairs), sum(y for _, y in pairs)
    return {"steps": len(pairs), "false": false, "flags": flags, "true_flags": tp,
            "precision": round(tp / flags, 4) if flags else None,
            "recall": round(tp / false, 4) if false else None}  # fmt: skip


def reliability(pairs: Sequence[tuple[float, bool]]) -> list[dict[str, Any]]:
    out = []
    for lo, hi in zip(BINS, BINS[1:], strict=False):
        inside = [(p, y) for p, y in pairs if lo <= p < hi]
        if inside:
            out.append({"bin": [lo, min(hi, 1.0)], "steps": len(inside),
                        "mean_predicted": round(sum(p for p, _ in inside) / len(inside), 4),
                        "observed_false": round(sum(y for _, y in inside) / len(inside), 4)})  # fmt: skip
    return out


def first_drafts(items: Sequence[Item], traces: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every perception first draft with its type, truth and what the detector said."""
    out = []
    for item, trace in zip(items, traces, strict=True):
        for step in trace["steps"]:
            draft = (step["original_text"] or step["text"]).strip()
            check = check_sentence(draft, item.scene.objects)
            if check.kind != PERCEPTION or check.claim is None:
                continue
            rejected = [check_sentence(r.strip(), item.scene.objects).faithful for r in step.get("rejected") or []]
            out.append({"type": step_type(check.claim), "false": check.faithful is False,
                        "flagged": step["detected"] == "unfaithful", "score": step.get("score"),
                        "confidence": step.get("confidence"), "rejected_true": sum(r is True for r in rejected),
                        "rejected": len(rejected)})  # fmt: skip
    return out


def analyse(items: Sequence[Item], raw: Mapping[str, Any], signal: Mapping[str, Any] | None) -> dict[str, Any]:
    judge = first_drafts(items, row_replies(raw, "judge:learned")[1])
    probe = first_drafts(items, row_replies(raw, "probe")[1])
    consistency = [
        {"type": s["type"], "false": not s["faithful"], "score": 1 - s["support"]}
        for s in (signal or {}).get("steps", [])
    ]
    types = sorted({d["type"] for d in judge + probe + consistency})
    by_type: dict[str, Any] = {}
    for t in [*types, "all"]:
        j = [d for d in judge if t in ("all", d["type"])]
        p = [d for d in probe if t in ("all", d["type"]) and d["score"] is not None]
        c = [d for d in consistency if t in ("all", d["type"])]
        by_type[t] = {
            "judge": _pr([(d["flagged"], d["false"]) for d in j]),
            "judge_confidence_auroc_on_flags": auroc(
                [d["confidence"] for d in j if d["flagged"] and d["confidence"] is not None],
                [d["false"] for d in j if d["flagged"] and d["confidence"] is not None],
            ),
            "probe": _pr([(d["flagged"], d["false"]) for d in p]),
            "probe_auroc": auroc([d["score"] for d in p], [d["false"] for d in p]),
            "consistency_at_2_of_8": _pr([(d["score"] >= 0.25, d["false"]) for d in c]) if c else None,
            "consistency_auroc": auroc([d["score"] for d in c], [d["false"] for d in c]) if c else None,
            "judge_refused_rewrites": sum(d["rejected"] for d in j),
            "judge_refused_rewrites_true": sum(d["rejected_true"] for d in j),
        }
    return {
        "by_step_type": by_type,
        "reliability": {
            "judge_confidence_on_flags": reliability(
                [(d["confidence"], d["false"]) for d in judge if d["flagged"] and d["confidence"] is not None]
            ),
            "probe_score": reliability([(d["score"], d["false"]) for d in probe if d["score"] is not None]),
            "consistency_share": reliability([(d["score"], d["false"]) for d in consistency]),
        },
    }


def plot(result: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfect")
    for name, rows in result["analysis"]["reliability"].items():
        if rows:
            ax.plot([r["mean_predicted"] for r in rows], [r["observed_false"] for r in rows], "o-", label=name)
    ax.set_xlabel("predicted P(false step)")
    ax.set_ylabel("observed share of false steps")
    ax.set_title(f"reliability on seed {result['seed']} ({result['chains']} chains)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    from faithproxy.benchmarks.evaluation.shapesworld_bench import JUDGE_WEIGHTS_DIR, benchmark
    from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
    from faithproxy.detectors.probe import Probe

    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--seed", type=int, default=997, choices=(997, 999), help="a development seed")
    cli.add_argument("--n", type=int, default=100)
    cli.add_argument("--probe", type=Path, default=Path("benchmarks/results/shapesworld-probe.json"))
    cli.add_argument("--signal", type=Path, help="a consistency_signal result on the same seed")
    cli.add_argument("--workdir", type=Path, default=Path("var/analysis"))
    cli.add_argument("--out", type=Path, required=True)
    args = cli.parse_args()
    started, load = time.time(), load_now()
    bench = benchmark(WEIGHTS_DIR, args.n, list(ROWS), 8, args.workdir, 3, seed=args.seed,
                      judge_model=JUDGE_WEIGHTS_DIR, probe_path=args.probe,
                      hidden_layers=Probe.load(args.probe).layers, resume=True)  # fmt: skip
    items = heldout_items(args.n, args.seed)
    raw: dict[str, Any] = {"traces": {}}
    for row in ROWS:
        part = json.loads((args.workdir / f"raw-{row.replace(':', '-')}.json").read_text(encoding="utf-8"))
        raw[row] = part["row"]
        raw["traces"] |= part["traces"]
    signal = json.loads(args.signal.read_text(encoding="utf-8")) if args.signal else None
    if signal is not None and signal["seed"] != args.seed:
        raise SystemExit("the consistency signal file is of another seed")
    result = {
        "command": f"python -m faithproxy.benchmarks.evaluation.detector_analysis --seed {args.seed} --n {args.n} "
        f"--probe {args.probe} --signal {args.signal} --out {args.out}",
        **run_record(started, load),
        "seed": args.seed,
        "chains": args.n,
        "analysis": analyse(items, raw, signal),
        "bench": {k: bench[k] for k in ("vanilla", "detectors")},
        "wall_s": round(time.time() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps(result["analysis"]["by_step_type"]["all"], indent=1))


if __name__ == "__main__":
    main()
