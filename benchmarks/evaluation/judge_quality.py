"""What a team can expect from its own judge: faithproxy in front of judges of set precision and recall.

    python -m faithproxy.benchmarks.evaluation.judge_quality --seed 997 --n 50 \
        --precision 0.2,0.4,0.6,0.8,1.0 --recall 0.4,0.7,1.0 \
        --out benchmarks/results/judge-quality/sweep-997.json

Each grid point is a `NoisyPixelJudge` (benchmarks/shapesworld/pixel_judge.py): the pixel oracle's verdicts with
seeded, per-sentence noise, so that its flags on first drafts have the set precision and recall. One vLLM
serves every point; the vanilla chains are decoded once and shared. For each point the judge row runs in
correct mode as `judge:pixels`, and the result records residual-UPR cut, accuracy and regenerations
against the precision and recall the flags really had (the coins are seeded; the realised figures are
what the plot uses). A team that measured its judge's precision and recall on a few hundred labelled
steps reads off the plot what the proxy will do for it; the real detectors' rows from other result
files are placed on it by `--place`.

Development seeds only. Resumable: a finished point's part in the workdir is read back (`--workdir`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.provenance import load_now, run_record
from faithproxy.benchmarks.evaluation.shapesworld_bench import DEV_MODE, SERVED_NAME, VLLM_START_S, run_all
from faithproxy.benchmarks.evaluation.shapesworld_rows import score_rows
from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items
from faithproxy.benchmarks.shapesworld.pixel_judge import NoisyPixelJudge

ROW = "judge:pixels"


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def point_figures(scored: dict[str, Any], vanilla_wall: float) -> dict[str, Any]:
    d = scored[ROW]
    g = d["detector_vs_ground_truth"]
    return {
        "realised_precision": g["precision"],
        "realised_recall": g["recall"],
        "upr_cut": d["upr_reduction_vs_vanilla"],
        "upr_residual": d["corrected"]["upr"],
        "accuracy_corrected": d["corrected"]["accuracy"],
        "regenerations": d["regenerations"],
        "judge_calls": d["judge_bill"]["calls"],
        "wall_vs_vanilla": round(d["wall_s"] / vanilla_wall, 2) if vanilla_wall else None,
    }


def plot(result: dict[str, Any], path: Path, placed: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    recalls = sorted({p["recall"] for p in points})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, key, label in zip(
        axes,
        ("upr_cut", "accuracy_corrected", "regenerations"),
        ("residual-UPR cut vs vanilla", "accuracy (vanilla dashed)", "regenerations"),
        strict=True,
    ):
        for r in recalls:
            line = sorted((p for p in points if p["recall"] == r), key=lambda p: p["realised_precision"])
            ax.plot([p["realised_precision"] for p in line], [p[key] for p in line], "o-", label=f"judge recall {r}")
        for real in placed:
            if real.get(key) is not None:
                ax.plot(real["precision"], real[key], "k*", markersize=12)
                ax.annotate(real["name"], (real["precision"], real[key]), fontsize=8, xytext=(4, 4),
                            textcoords="offset points")  # fmt: skip
        if key == "accuracy_corrected":
            ax.axhline(result["vanilla"]["accuracy"], color="grey", linestyle="--")
        ax.set_xlabel("judge flag precision (realised)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"faithproxy in front of a judge of set quality: ShapesWorld seed {result['seed']}, "
                 f"{result['chains']} chains per point (★: real detectors, held-out run)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def place(paths: list[Path]) -> list[dict[str, Any]]:
    """Real rows from bench result files: precision, cut, accuracy and regenerations of each row."""
    out = []
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        for name, d in data["detectors"].items():
            out.append({
                "name": name,
                "source": str(path),
                "precision": d["detector_vs_ground_truth"]["precision"],
                "recall": d["detector_vs_ground_truth"]["recall"],
                "upr_cut": d["upr_reduction_vs_vanilla"],
                "accuracy_corrected": d["corrected"]["accuracy"],
                "regenerations": round(d["regenerations"] * 50 / data["n_chains"], 1),  # per 50 chains
            })  # fmt: skip
    return out


def main() -> None:
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--seed", type=int, default=997, choices=(997, 999), help="a development seed")
    cli.add_argument("--n", type=int, default=50)
    cli.add_argument("--precision", default="0.2,0.4,0.6,0.8,1.0")
    cli.add_argument("--recall", default="0.4,0.7,1.0")
    cli.add_argument("--base-rate", type=float, default=0.15, help="false share of first drafts (seed 997: 57/383)")
    cli.add_argument("--workdir", type=Path, default=Path("var/judge-quality"))
    cli.add_argument("--place", type=Path, nargs="*", default=[], help="bench result files whose rows to place")
    cli.add_argument("--out", type=Path, required=True)
    args = cli.parse_args()
    items = heldout_items(args.n, args.seed)
    started, load = time.time(), load_now()
    points = []
    with start_vllm(WEIGHTS_DIR, served_model_name=SERVED_NAME, env=DEV_MODE, health_timeout=VLLM_START_S) as vllm:
        first = args.workdir / "vanilla"
        for p in _floats(args.precision):
            for r in _floats(args.recall):
                workdir = args.workdir / f"p{p}-r{r}"
                workdir.mkdir(parents=True, exist_ok=True)
                if (first / "raw-vanilla.json").exists():
                    shutil.copy(first / "raw-vanilla.json", workdir / "raw-vanilla.json")
                oracle = NoisyPixelJudge(p, r, args.base_rate)
                raw = asyncio.run(
                    run_all(vllm.base_url, items, [ROW], 8, workdir, 3, None, resume=True, oracle=oracle)
                )  # fmt: skip
                if not (first / "raw-vanilla.json").exists():
                    first.mkdir(parents=True, exist_ok=True)
                    shutil.copy(workdir / "raw-vanilla.json", first / "raw-vanilla.json")
                scored = score_rows(items, raw, [ROW])
                points.append({"precision": p, "recall": r, **point_figures(scored, raw["vanilla_wall_s"])})
                print(points[-1], flush=True)
                vanilla = raw
    from faithproxy.benchmarks.evaluation.shapesworld_rows import chain_scores

    result = {
        "command": "python -m faithproxy.benchmarks.evaluation.judge_quality "
        f"--seed {args.seed} --n {args.n} --precision {args.precision} --recall {args.recall} "
        f"--base-rate {args.base_rate} --out {args.out}",
        **run_record(started, load),
        "seed": args.seed,
        "chains": args.n,
        "base_rate": args.base_rate,
        "vanilla": chain_scores(items, vanilla["vanilla_replies"]),
        "points": points,
        "placed": place(args.place),
        "wall_s": round(time.time() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    plot(result, args.out.with_suffix(".png"), result["placed"])


if __name__ == "__main__":
    main()
