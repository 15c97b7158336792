"""One result from `faithproxy bench shapesworld` runs over the same scenes, each with its own rows.

    faithproxy bench shapesworld --merge benchmarks/results/shapesworld-detectors.json \
        benchmarks/results/shapesworld-probe-cascade.json --out benchmarks/results/shapesworld-all.json

Why: on 2 CPU cores a row of the learned judge takes most of an hour, so rows are run a few at a time;
a goal that compares two rows (the cascade against the judge alone) needs them in one result. Runs
merge only when they scored the same thing: the same scenes (seed and count), the same K and samples
per try, the same weights for every model they share, and a vanilla pass that came out the same
(every figure but its wall time: vanilla decoding is greedy, so the same weights give the same
chains). Anything else is refused with the field that differs. Each row keeps the wall time of its
own run's vanilla pass (`vanilla_wall_s`), because wall times compare only within one run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from faithproxy.benchmarks.evaluation.shapesworld_report import goals, headline

SAME = ("n_chains", "scenes_seed", "max_retries", "regeneration_samples")
SHARED_IF_SET = ("learned_judge", "hidden_states_layers", "hidden_states_server", "cascade_thresholds")


class MergeError(ValueError):
    """The runs did not score the same scenes the same way."""


def merge(results: Sequence[dict[str, Any]], sources: Sequence[str]) -> dict[str, Any]:
    """The runs' rows in one result (first run's order first); goals and headline figures recomputed."""
    if len(results) < 2:
        raise MergeError("merging needs at least two results")
    first = results[0]
    for name, other in zip(sources[1:], results[1:], strict=True):
        if other.get("first_item", 0) != first.get("first_item", 0):
            raise MergeError(f"{name}: first_item differs from {sources[0]}'s")
        for key in SAME:
            if other.get(key) != first.get(key):
                raise MergeError(f"{name}: {key} is {other.get(key)!r}, {sources[0]} has {first.get(key)!r}")
        for key in set(first["vanilla"]) | set(other["vanilla"]):
            if key != "wall_s" and other["vanilla"].get(key) != first["vanilla"].get(key):
                raise MergeError(f"{name}: the vanilla pass differs from {sources[0]}'s ({key})")
    models: dict[str, Any] = {}
    shared: dict[str, Any] = {key: None for key in SHARED_IF_SET}
    detectors: dict[str, Any] = {}
    left_out: dict[str, str] = {}
    runs = []
    for name, result in zip(sources, results, strict=True):
        for role, record in result.get("models", {}).items():
            if role in models and models[role]["sha256"] != record["sha256"]:
                raise MergeError(f"{name}: its {role} is not the same weights as an earlier run's")
            models.setdefault(role, record)
        for key in SHARED_IF_SET:
            value = result.get(key)
            if value is not None and shared[key] is not None and value != shared[key]:
                raise MergeError(f"{name}: {key} is {value!r}, an earlier run had {shared[key]!r}")
            if value is not None:
                shared[key] = value
        for row, figures in result["detectors"].items():
            if row in detectors:
                raise MergeError(f"{name}: row {row} is in an earlier run too")
            detectors[row] = figures | {"vanilla_wall_s": figures.get("vanilla_wall_s", result["vanilla"]["wall_s"])}
        left_out |= result.get("left_out") or {}
        runs.append(
            {
                "source": name,
                "rows": list(result["detectors"]),
                "command": result.get("command"),
                "faithproxy_commit": result.get("faithproxy_commit"),
            }
        )
    merged: dict[str, Any] = {key: first.get(key) for key in SAME} | {"first_item": first.get("first_item", 0)}
    merged |= {"model": first.get("model"), "models": models, **shared, "vanilla": first["vanilla"]}
    merged["detectors"] = detectors
    merged["goals"] = goals(merged)
    merged |= headline(merged)
    merged["left_out"] = {row: why for row, why in left_out.items() if row not in detectors}
    merged["runs"] = runs
    return merged
