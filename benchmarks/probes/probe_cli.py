"""`faithproxy probe train|eval`: hidden-state probes from recorded traces.

    faithproxy probe train --traces T.jsonl... --labels judge|file [--label-file L.jsonl] --out probe.json
    faithproxy probe eval --probe probe.json --traces T.jsonl... --labels judge|file

Traces are the proxy's trace records (FAITHPROXY_TRACE_PATH, with FAITHPROXY_RECORD_FEATURES=true so
that perception steps carry `features`) or the feature traces `benchmarks/probes/probe_bench.py collect`
writes; both are JSON lines with `id`, `model` and `steps[]` (`index`, `kind`, `features`, and the
labels). Only perception steps with features are used.

Labels: `judge` — the verdict the step's original text got from the detector that served it
(`detected`: the judge's, when traces were recorded with the judge; distilling the judge into the
probe); `file` — ground truth: `--label-file` (JSON lines `{"id", "index", "faithful"}`) or, without
it, each step's own `faithful` field.

Training: a held-out split BY CHAIN (`--val-fraction`), standardised features, logistic regression
(or a one-hidden-layer MLP) with class weights inversely proportional to class frequency (unfaithful
steps are rare in real chains: unweighted, the probe learns to say "faithful"), L2, full-batch Adam.
The threshold maximises F1 on out-of-fold scores of the training split (3 folds), never on the
held-out chains. The report gives precision/recall/F1 on the unfaithful class and AUROC, overall and
by step position (i <= 2 vs i > 2, i counted from 1), and is stored in the probe file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from faithproxy.clients.hidden_states import Features
from faithproxy.detectors.probe import Probe, ProbeFileError, parse_recipe, recipe_key, recorded_features

EARLY = 2  # the paper: probes trained on steps i <= 2 lose ~10 AUROC points on i > 2


@dataclass
class Dataset:
    x: np.ndarray  # [n, features]
    y: np.ndarray  # [n] 1 = unfaithful
    chain: list[str]  # the chain id of each row
    position: np.ndarray  # [n] 1-based step position in its chain
    model: str | None
    layers: list[int]
    hidden_size: int
    digest: str
    splits: set[str]  # the records' `split` fields (probe_bench collect writes them): "validation", "heldout", ...


def step_features(step: dict[str, Any], recipe: str = "last_token") -> Features | None:
    """A step's features under `recipe` (a recipe key: `last_token`, `mean_last_4`): its `features`, or
    the entry of `features_by_recipe` (probe_bench collect --recipes) when those are another recipe's."""
    return recorded_features(step, recipe)


def load_traces(
    paths: Sequence[str | Path],
    labels: str,
    label_file: str | Path | None = None,
    layers: list[int] | None = None,
    recipe: str = "last_token",
) -> Dataset:
    """Rows for every perception step with features and a label; `layers` selects captured layers,
    `recipe` the feature recipe (SystemExit when a step with features lacks that recipe's)."""
    truth: dict[tuple[str, int], bool] = {}
    if label_file is not None:
        for line in Path(label_file).read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                truth[(str(row["id"]), int(row["index"]))] = bool(row["faithful"])
    digest = hashlib.sha256()
    xs, ys, chains, positions = [], [], [], []
    models: set[str] = set()
    splits: set[str] = set()
    captured: list[int] | None = None
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("split"):
                splits.add(str(record["split"]))
            for step in record.get("steps") or []:
                if step.get("kind") != "perception" or not step.get("features"):
                    continue
                label = _label(record, step, labels, truth, label_file is not None)
                if label is None:
                    continue
                features = step_features(step, recipe)
                if features is None:
                    raise SystemExit(f"{path}: chain {record.get('id')!r} step {step['index']} has no "
                                     f"features of recipe {recipe!r} (collect with --recipes {recipe})")  # fmt: skip
                if captured is None:
                    captured = features.layers
                chosen = layers or captured
                xs.append(features.select(chosen))
                ys.append(0 if label else 1)
                chains.append(str(record.get("id")))
                positions.append(int(step["index"]) + 1)
                if record.get("model"):
                    models.add(str(record["model"]))
                digest.update(f"{record.get('id')}:{step['index']}:{ys[-1]}:".encode())
                digest.update(xs[-1].astype("<f4").tobytes())
    if not xs:
        raise SystemExit("no labelled perception steps with features in the traces")
    if len(models) > 1:
        raise SystemExit(f"traces mix hidden states of several models: {sorted(models)}")
    chosen = layers or captured or []
    return Dataset(
        x=np.stack(xs).astype(np.float64),
        y=np.asarray(ys, dtype=np.int64),
        chain=chains,
        position=np.asarray(positions),
        model=next(iter(models)) if models else None,
        layers=list(chosen),
        hidden_size=xs[0].shape[0] // max(1, len(chosen)),
        digest=digest.hexdigest(),
        splits=splits,
    )


def _label(
    record: dict[str, Any], step: dict[str, Any], labels: str, truth: dict[tuple[str, int], bool], from_file: bool
) -> bool | None:
    """True = faithful, False = unfaithful, None = no label."""
    if labels == "judge":
        detected = step.get("detected")
        return {"faithful": True, "unfaithful": False}.get(detected) if isinstance(detected, str) else None
    if from_file:
        return truth.get((str(record.get("id")), int(step["index"])))
    value = step.get("faithful")
    return value if isinstance(value, bool) else None


# ---- the classifier ---------------------------------------------------------------------------


def fit(
    x: np.ndarray, y: np.ndarray, *, kind: str = "logistic", l2: float = 1e-2, steps: int = 600, seed: int = 0
) -> dict[str, Any]:
    """Class-weighted (balanced) logistic regression or 1-hidden-layer MLP; returns the classifier dict."""
    rng = np.random.default_rng(seed)
    mean = x.mean(0)
    std = x.std(0) + 1e-6
    z = (x - mean) / std
    n_pos = max(1, int(y.sum()))
    n_neg = max(1, len(y) - int(y.sum()))
    weight = np.where(y == 1, len(y) / (2 * n_pos), len(y) / (2 * n_neg))
    dim = z.shape[1]
    if kind == "logistic":
        params = {"weights": np.zeros(dim), "bias": np.zeros(())}
    elif kind == "mlp":
        hidden = 64
        params = {
            "w1": rng.normal(0, 1 / np.sqrt(dim), (dim, hidden)),
            "b1": np.zeros(hidden),
            "w2": rng.normal(0, 1 / np.sqrt(hidden), hidden),
            "b2": np.zeros(()),
        }
    else:
        raise ValueError(f"unknown classifier {kind!r}")
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    lr, b1, b2 = 0.05, 0.9, 0.999
    for t in range(1, steps + 1):
        grads = _grads(params, z, y, weight, kind, l2)
        for k, g in grads.items():
            m, v = moments[k]
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            moments[k] = (m, v)
            params[k] = params[k] - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + 1e-8)
    return {"kind": kind, "mean": mean, "std": std, "l2": l2, **params}


def _grads(
    p: dict[str, np.ndarray], z: np.ndarray, y: np.ndarray, w: np.ndarray, kind: str, l2: float
) -> dict[str, np.ndarray]:
    n = len(y)
    if kind == "logistic":
        prob = 1 / (1 + np.exp(-np.clip(z @ p["weights"] + p["bias"], -60, 60)))
        err = w * (prob - y) / n
        return {"weights": z.T @ err + l2 * p["weights"], "bias": np.asarray(err.sum())}
    pre = z @ p["w1"] + p["b1"]
    h = np.maximum(0, pre)
    prob = 1 / (1 + np.exp(-np.clip(h @ p["w2"] + p["b2"], -60, 60)))
    err = w * (prob - y) / n
    dh = np.outer(err, p["w2"]) * (pre > 0)
    return {
        "w1": z.T @ dh + l2 * p["w1"],
        "b1": dh.sum(0),
        "w2": h.T @ err + l2 * p["w2"],
        "b2": np.asarray(err.sum()),
    }


def scores_of(classifier: dict[str, Any], x: np.ndarray) -> np.ndarray:
    probe = Probe(model="-", layers=[0], hidden_size=x.shape[1], classifier=classifier)
    return probe.predict(x)


# ---- metrics ----------------------------------------------------------------------------------


def auroc(y: np.ndarray, s: np.ndarray) -> float | None:
    """Mann-Whitney AUROC (ties count half); None when a class is missing."""
    pos, neg = s[y == 1], s[y == 0]
    if len(pos) == 0 or len(neg) == 0:
        return None
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def binary_metrics(y: np.ndarray, predicted: np.ndarray) -> dict[str, Any]:
    """Precision, recall, F1 of the UNFAITHFUL class (label 1), and the counts."""
    tp = int(((predicted == 1) & (y == 1)).sum())
    fp = int(((predicted == 1) & (y == 0)).sum())
    fn = int(((predicted == 0) & (y == 1)).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"n": int(len(y)), "positives": int(y.sum()), "precision": precision, "recall": recall, "f1": f1}


def report(y: np.ndarray, s: np.ndarray, position: np.ndarray, threshold: float) -> dict[str, Any]:
    out = {**binary_metrics(y, (s > threshold).astype(int)), "auroc": auroc(y, s), "threshold": threshold}
    out["by_position"] = {}
    for name, mask in ((f"i<={EARLY}", position <= EARLY), (f"i>{EARLY}", position > EARLY)):
        if mask.any():
            part = binary_metrics(y[mask], (s[mask] > threshold).astype(int))
            out["by_position"][name] = {**part, "auroc": auroc(y[mask], s[mask])}
    return out


def best_threshold(y: np.ndarray, s: np.ndarray) -> float:
    """The threshold that maximises F1 on (y, s): midway between neighbouring scores."""
    candidates = np.unique(s)
    if len(candidates) < 2:
        return 0.5
    cuts = (candidates[:-1] + candidates[1:]) / 2
    f1s = [binary_metrics(y, (s > c).astype(int))["f1"] for c in cuts]
    return float(cuts[int(np.argmax(f1s))])


def split_chains(chains: list[str], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ids = sorted(set(chains))
    random.Random(seed).shuffle(ids)
    held = set(ids[: max(1, round(len(ids) * fraction))]) if fraction > 0 else set()
    mask = np.asarray([c in held for c in chains])
    return ~mask, mask


def out_of_fold(x: np.ndarray, y: np.ndarray, chains: list[str], kind: str, l2: float, seed: int) -> np.ndarray:
    ids = sorted(set(chains))
    random.Random(seed + 1).shuffle(ids)
    fold_of = {c: i % 3 for i, c in enumerate(ids)}
    folds = np.asarray([fold_of[c] for c in chains])
    scores = np.zeros(len(y))
    for k in range(3):
        test = folds == k
        if not test.any() or test.all() or len(np.unique(y[~test])) < 2:
            scores[test] = 0.5
            continue
        scores[test] = scores_of(fit(x[~test], y[~test], kind=kind, l2=l2, seed=seed), x[test])
    return scores


# ---- commands ---------------------------------------------------------------------------------


def train(args: argparse.Namespace) -> int:
    try:
        recipe = parse_recipe(args.recipe)
    except ProbeFileError as exc:
        raise SystemExit(str(exc)) from exc
    data = load_traces(args.traces, args.labels, args.label_file, args.layers, args.recipe)
    evaluation = sorted(data.splits & {"heldout", "evaluation"})
    if evaluation:  # probe_bench collect --for-evaluation: the scenes a benchmark scores on
        raise SystemExit(
            f"the traces hold evaluation chains (split {', '.join(evaluation)}): a probe is trained on "
            "validation chains only (probe_bench collect --seed 997); evaluate it with probe eval"
        )
    model = args.model or data.model
    if not model:
        raise SystemExit("the traces name no model: give --model")
    fit_mask, val_mask = split_chains(data.chain, args.val_fraction, args.seed)
    x, y = data.x[fit_mask], data.y[fit_mask]
    chains = [c for c, m in zip(data.chain, fit_mask, strict=True) if m]
    if len(np.unique(y)) < 2:
        raise SystemExit("the training split has a single class: more traces are needed")
    if args.threshold is None:
        threshold = best_threshold(y, out_of_fold(x, y, chains, args.classifier, args.l2, args.seed))
    else:
        threshold = args.threshold
    classifier = fit(x, y, kind=args.classifier, l2=args.l2, seed=args.seed)
    imbalance = (
        f"class weights n/(2*n_class): unfaithful x{len(y) / (2 * max(1, y.sum())):.2f}, "
        f"faithful x{len(y) / (2 * max(1, len(y) - y.sum())):.2f}; threshold maximises F1 on 3-fold "
        "out-of-fold scores of the training chains"
    )
    validation = (
        report(data.y[val_mask], scores_of(classifier, data.x[val_mask]), data.position[val_mask], threshold)
        if val_mask.any()
        else {}
    )
    train_report = report(y, scores_of(classifier, x), data.position[fit_mask], threshold)
    probe = Probe(
        model=model,
        layers=data.layers,
        hidden_size=data.hidden_size,
        classifier=classifier,
        threshold=threshold,
        recipe=recipe,
        model_digest=args.model_digest,
        training={
            "data_sha256": data.digest,
            "traces": [str(p) for p in args.traces],
            "labels": args.labels,
            "splits": sorted(data.splits),
            "n_train": int(fit_mask.sum()),
            "n_val": int(val_mask.sum()),
            "chains_train": len(set(chains)),
            "chains_val": len({c for c, m in zip(data.chain, val_mask, strict=True) if m}),
            "positives_train": int(y.sum()),
            "imbalance": imbalance,
            "classifier": args.classifier,
            "l2": args.l2,
            "seed": args.seed,
            "val_fraction": args.val_fraction,
            "train_metrics": _round(train_report),
        },
        validation=_round(validation),
    )
    probe.save(args.out)
    _print_report(
        f"probe for {model}, layers {data.layers}, {args.recipe}, {args.classifier}",
        probe.training,
        validation,
        train_report,
    )
    print(f"wrote {args.out}")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    probe = Probe.load(args.probe)
    data = load_traces(args.traces, args.labels, args.label_file, probe.layers, recipe_key(probe.recipe))
    if data.model and data.model != probe.model:
        raise SystemExit(f"the probe is for model {probe.model!r}; the traces are of {data.model!r}")
    threshold = probe.threshold if args.threshold is None else args.threshold
    result = report(data.y, probe.predict(data.x), data.position, threshold)
    _print_report(f"probe {args.probe} on {len(data.y)} steps", {}, result, None)
    if args.json:
        print(json.dumps(_round(result)))
    return 0


def _round(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, float):
        return round(value, 4)
    return value


def _fmt(m: dict[str, Any]) -> str:
    au = "-" if m.get("auroc") is None else f"{m['auroc']:.3f}"
    return (
        f"n={m['n']:<5} unfaithful={m['positives']:<5} P={m['precision']:.3f} R={m['recall']:.3f} "
        f"F1={m['f1']:.3f} AUROC={au}"
    )


def _print_report(title: str, training: dict[str, Any], held: dict[str, Any], fitted: dict[str, Any] | None) -> None:
    print(title)
    if training:
        print(f"  data sha256 {training['data_sha256'][:16]}…  labels: {training['labels']}")
        print(f"  imbalance: {training['imbalance']}")
    if fitted is not None:
        print(f"  train      {_fmt(fitted)}")
    if held:
        print(f"  held-out   {_fmt(held)}  (threshold {held['threshold']:.3f})")
        for name, part in held.get("by_position", {}).items():
            print(f"    {name:<8} {_fmt(part)}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faithproxy probe", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("train", "eval"):
        p = sub.add_parser(name)
        p.add_argument("--traces", nargs="+", required=True, help="trace / feature-trace JSONL files")
        p.add_argument("--labels", choices=("judge", "file"), required=True)
        p.add_argument("--label-file", help="JSONL {id, index, faithful} (with --labels file)")
        p.add_argument("--threshold", type=float, help="instead of the tuned (train) or stored (eval) one")
        if name == "train":
            p.add_argument("--out", required=True, help="the probe file to write")
            p.add_argument("--layers", type=int, nargs="+", help="layer ids to use (default: all captured)")
            p.add_argument("--recipe", default="last_token", help="feature recipe: last_token or mean_last_K")
            p.add_argument("--model", help="served model name (default: the traces' model)")
            p.add_argument("--model-digest", help="weights digest to record in the probe file")
            p.add_argument("--classifier", choices=("logistic", "mlp"), default="logistic")
            p.add_argument("--l2", type=float, default=1e-2)
            p.add_argument("--val-fraction", type=float, default=0.25, help="share of CHAINS held out")
            p.add_argument("--seed", type=int, default=0)
            p.set_defaults(func=train)
        else:
            p.add_argument("--probe", required=True)
            p.add_argument("--json", action="store_true", help="also print the metrics as one JSON line")
            p.set_defaults(func=evaluate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
