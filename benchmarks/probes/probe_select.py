"""Choose a probe's recipe, layers and classifier on validation chains only, by cross-validation by chain.

    python -m faithproxy.benchmarks.probes.probe_select --traces var/probe/sw-val-2000.jsonl --labels file \\
        --recipes last_token mean_last_8 --layer-sets 3,6 all --classifiers logistic mlp --out var/probe/select.json

Every configuration is scored the way `faithproxy probe train` would build it: the validation chains are
cut into `--folds` folds by chain; for each fold a probe is fitted on the others (class-weighted, its
threshold from 3-fold out-of-fold scores of those chains, never from the fold it is scored on) and
scored on the fold. The table gives the unfaithful class's F1 (mean and spread over folds), precision,
recall and AUROC. Traces collected for evaluation (`probe_bench collect --for-evaluation`: the held-out
scenes) are refused, so the held-out chains never take part in the choice.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from faithproxy.benchmarks.probes import probe_cli


def _layer_set(text: str) -> list[int] | None:
    """`3,6` → [3, 6]; `all` → None (every captured layer)."""
    return None if text == "all" else [int(x) for x in text.split(",")]


def select_layers(data: probe_cli.Dataset, layers: list[int] | None) -> probe_cli.Dataset:
    """The same rows with only `layers`' columns (None: all), in the order given."""
    if layers is None:
        return data
    missing = [layer for layer in layers if layer not in data.layers]
    if missing:
        raise SystemExit(f"layers {missing} were not captured (have {data.layers})")
    h = data.hidden_size
    columns = np.concatenate([np.arange(h) + h * data.layers.index(layer) for layer in layers])
    return dataclasses.replace(data, x=data.x[:, columns], layers=list(layers))


def chain_folds(chains: list[str], folds: int, seed: int) -> np.ndarray:
    ids = sorted(set(chains))
    random.Random(seed).shuffle(ids)
    fold_of = {c: i % folds for i, c in enumerate(ids)}
    return np.asarray([fold_of[c] for c in chains])


def cross_validate(data: probe_cli.Dataset, kind: str, l2: float, folds: int, seed: int) -> dict[str, Any]:
    """Per-fold F1 at the fold's own out-of-fold threshold, and pooled AUROC."""
    fold = chain_folds(data.chain, folds, seed)
    scores = np.zeros(len(data.y))
    rows = []
    for k in range(folds):
        test = fold == k
        x, y = data.x[~test], data.y[~test]
        chains = [c for c, m in zip(data.chain, ~test, strict=True) if m]
        threshold = probe_cli.best_threshold(y, probe_cli.out_of_fold(x, y, chains, kind, l2, seed))
        classifier = probe_cli.fit(x, y, kind=kind, l2=l2, seed=seed)
        scores[test] = probe_cli.scores_of(classifier, data.x[test])
        rows.append(probe_cli.binary_metrics(data.y[test], (scores[test] > threshold).astype(int)))
    f1 = [r["f1"] for r in rows]
    return {
        "f1_mean": float(np.mean(f1)),
        "f1_std": float(np.std(f1)),
        "f1_folds": f1,
        "precision_mean": float(np.mean([r["precision"] for r in rows])),
        "recall_mean": float(np.mean([r["recall"] for r in rows])),
        "auroc": probe_cli.auroc(data.y, scores),
        "n": int(len(data.y)),
        "positives": int(data.y.sum()),
        "chains": len(set(data.chain)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faithproxy.benchmarks.probes.probe_select",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--traces", nargs="+", required=True)
    parser.add_argument("--labels", choices=("judge", "file"), default="file")
    parser.add_argument("--recipes", nargs="+", default=["last_token"])
    parser.add_argument("--layer-sets", nargs="+", default=["all"], help="comma-separated layer ids, or all")
    parser.add_argument("--classifiers", nargs="+", choices=("logistic", "mlp"), default=["logistic"])
    parser.add_argument("--l2", type=float, nargs="+", default=[1e-2])
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-chains", type=int, help="only the first N chains (a learning curve)")
    parser.add_argument("--out", help="append one JSON line per configuration here")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))

    print(f"{'recipe':<13} {'layers':<16} {'classifier':<9} {'l2':>7} {'F1':>6} {'±':>5} {'P':>6} {'R':>6} "
          f"{'AUROC':>6}  n/unfaithful/chains  seconds")  # fmt: skip
    for recipe in args.recipes:
        full = probe_cli.load_traces(args.traces, args.labels, None, None, recipe)  # every captured layer, once
        evaluation = full.splits & {"heldout", "evaluation"}
        if evaluation:
            raise SystemExit(f"the traces hold evaluation chains ({sorted(evaluation)}): choose on validation data")
        if args.max_chains:
            keep = np.isin(np.asarray(full.chain), sorted(set(full.chain))[: args.max_chains])
            full.x, full.y, full.position = full.x[keep], full.y[keep], full.position[keep]
            full.chain = [c for c, k in zip(full.chain, keep, strict=True) if k]
        for layers_text in args.layer_sets:
            data = select_layers(full, _layer_set(layers_text))
            for kind in args.classifiers:
                for l2 in args.l2:
                    started = time.perf_counter()
                    result = cross_validate(data, kind, l2, args.folds, args.seed)
                    seconds = time.perf_counter() - started
                    print(f"{recipe:<13} {','.join(map(str, data.layers)):<16} {kind:<9} {l2:>7g} "
                          f"{result['f1_mean']:>6.3f} {result['f1_std']:>5.3f} {result['precision_mean']:>6.3f} "
                          f"{result['recall_mean']:>6.3f} {result['auroc']:>6.3f}  {result['n']}/{result['positives']}/"
                          f"{result['chains']}  {seconds:.0f}", flush=True)  # fmt: skip
                    if args.out:
                        row = {"recipe": recipe, "layers": data.layers, "classifier": kind, "l2": l2,
                               "folds": args.folds, "seed": args.seed, "traces": args.traces,
                               "data_sha256": full.digest, **result}  # fmt: skip
                        with Path(args.out).open("a", encoding="utf-8") as handle:
                            handle.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
