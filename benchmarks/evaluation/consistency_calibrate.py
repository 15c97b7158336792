"""One calibrated probability per step from the consistency signal, fitted on development seeds only.

    python -m faithproxy.benchmarks.evaluation.consistency_calibrate \
        benchmarks/results/consistency/signal-997.json --precision 0.6 \
        --out benchmarks/results/consistency/calibration-997.json

Platt scaling: P(false | s) = 1 / (1 + exp(-(a s + b))), s the share of samples that do not support the
step, fitted by maximum likelihood (Newton's method on the two parameters) on the steps of a signal
file (`consistency_signal`). The file it writes is what `FAITHPROXY_CONSISTENCY_CALIBRATION` reads, with
the threshold on the calibrated probability that reaches the stated precision on the same steps (the
lowest threshold whose flags have at least that precision), and a reliability diagram (PNG beside it):
mean predicted probability against the observed share of false steps, per bin, raw share and calibrated.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from faithproxy.benchmarks.evaluation.shapesworld_bench import git_commit


def fit(share: np.ndarray, false: np.ndarray, iterations: int = 50) -> tuple[float, float]:
    """(a, b) of the logistic fit, with a tiny ridge so that separable data stays finite."""
    x = np.stack([share, np.ones_like(share)], axis=1)
    w = np.zeros(2)
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-x @ w))
        gradient = x.T @ (p - false) + 1e-3 * w
        hessian = x.T @ (x * (p * (1 - p))[:, None]) + 1e-3 * np.eye(2)
        w -= np.linalg.solve(hessian, gradient)
    return float(w[0]), float(w[1])


def reliability(predicted: np.ndarray, false: np.ndarray, bins: int = 5) -> list[dict[str, Any]]:
    out = []
    edges = np.linspace(0, 1, bins + 1)
    for lo, hi in zip(edges, edges[1:], strict=False):
        inside = (predicted >= lo) & ((predicted < hi) | (hi == 1.0))
        if inside.any():
            out.append({"bin": [round(float(lo), 2), round(float(hi), 2)], "steps": int(inside.sum()),
                        "mean_predicted": round(float(predicted[inside].mean()), 4),
                        "observed_false": round(float(false[inside].mean()), 4)})  # fmt: skip
    return out


def threshold_for(predicted: np.ndarray, false: np.ndarray, precision: float) -> dict[str, Any] | None:
    for t in sorted(set(predicted.round(6).tolist())):
        flagged = predicted >= t - 1e-9
        if flagged.sum() and false[flagged].mean() >= precision:
            return {"threshold": round(t, 4), "precision": round(float(false[flagged].mean()), 4),
                    "recall": round(float(false[flagged].sum() / false.sum()), 4)}  # fmt: skip
    return None


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("signal", type=Path, nargs="+", help="consistency_signal result files (development seeds)")
    cli.add_argument("--precision", type=float, default=0.6, help="the flags' stated precision")
    cli.add_argument("--out", type=Path, required=True)
    args = cli.parse_args()
    steps, sources = [], []
    for path in args.signal:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data["seed"] not in (997, 999):
            raise SystemExit(f"{path}: seed {data['seed']} is not a development seed")
        steps += data["steps"]
        sources.append({"file": str(path), "seed": data["seed"], "k": data["k"], "commit": data["commit"]})
    share = np.array([1 - s["support"] for s in steps])
    false = np.array([0.0 if s["faithful"] else 1.0 for s in steps])
    a, b = fit(share, false)
    calibrated = 1 / (1 + np.exp(-(a * share + b)))
    result = {
        "command": "python -m faithproxy.benchmarks.evaluation.consistency_calibrate "
        + " ".join(str(p) for p in args.signal)
        + f" --precision {args.precision} --out {args.out}",
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]},
        "a": round(a, 6),
        "b": round(b, 6),
        "fitted_on": sources,
        "steps": len(steps),
        "false_steps": int(false.sum()),
        "log_loss": round(float(-np.mean(false * np.log(calibrated) + (1 - false) * np.log(1 - calibrated))), 4),
        "brier": {
            "raw_share": round(float(np.mean((share - false) ** 2)), 4),
            "calibrated": round(float(np.mean((calibrated - false) ** 2)), 4),
        },  # fmt: skip
        "reliability": {"raw_share": reliability(share, false), "calibrated": reliability(calibrated, false)},
        "stated_precision": args.precision,
        "flag_at": threshold_for(calibrated, false, args.precision),
        "flag_at_raw_share": threshold_for(share, false, args.precision),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    _plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("a", "b", "brier", "flag_at", "flag_at_raw_share")}))


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfect")
    for name, rows in result["reliability"].items():
        ax.plot([r["mean_predicted"] for r in rows], [r["observed_false"] for r in rows], "o-", label=name)
        for r in rows:
            ax.annotate(str(r["steps"]), (r["mean_predicted"], r["observed_false"]), fontsize=7)
    ax.set_xlabel("predicted P(false step)")
    ax.set_ylabel("observed share of false steps")
    ax.set_title(f"consistency, {result['steps']} steps (development seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
