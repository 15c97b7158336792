"""How well a step typer finds perception steps, per source of labelled chains, and what the gate saves.

    python -m faithproxy.benchmarks.evaluation.typer_bench                # held-out split (the figures)
    python -m faithproxy.benchmarks.evaluation.typer_bench --split tune   # what the typer was tuned on

For each source (benchmarks/evaluation/typer_data.py) it prints, for the shipped typer and, beside it,
the keyword typer it replaced:

- recall: perception steps typed PERCEPTION, over all perception steps. A perception step the typer
  misses is never sent to the judge when the gate is on, so this is the figure that must stay high;
- precision: perception steps among the steps typed PERCEPTION;
- sent: the share of steps typed PERCEPTION, i.e. sent to the judge one step per call; `calls@4`: the
  share of judge calls left when steps go in batches of 4 (a batch goes when any of its steps is typed
  PERCEPTION), against one call per batch without the gate.

With `--misses` it lists the perception steps the typer missed (use it on the tune split only: reading
the held-out misses would be tuning on them).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from faithproxy.benchmarks.evaluation.labelled import PERCEPTION, LabelledChain
from faithproxy.benchmarks.evaluation.typer_data import SPLITS, load_fixture, load_hand, load_shapesworld
from faithproxy.faithcore.kinds import classify_step, keyword_kind
from faithproxy.faithcore.types import StepKind

Typer = Callable[[str], StepKind]
TYPERS: dict[str, Typer] = {"typer": classify_step, "keyword": keyword_kind}
BATCH = 4


@dataclass
class Figures:
    steps: int = 0
    perception: int = 0
    typed: int = 0  # steps typed PERCEPTION
    hits: int = 0  # perception steps typed PERCEPTION
    batches: int = 0
    batches_sent: int = 0

    @property
    def recall(self) -> float:
        return self.hits / self.perception if self.perception else float("nan")

    @property
    def precision(self) -> float:
        return self.hits / self.typed if self.typed else float("nan")

    @property
    def sent(self) -> float:
        return self.typed / self.steps if self.steps else float("nan")

    @property
    def calls(self) -> float:
        return self.batches_sent / self.batches if self.batches else float("nan")


def score(chains: Sequence[LabelledChain], typer: Typer, misses: list[str] | None = None) -> Figures:
    figures = Figures()
    for chain in chains:
        typed = [typer(s.text) is StepKind.PERCEPTION for s in chain.steps]
        for step, is_typed in zip(chain.steps, typed, strict=True):
            gold = step.kind == PERCEPTION
            figures.steps += 1
            figures.perception += gold
            figures.typed += is_typed
            figures.hits += gold and is_typed
            if gold and not is_typed and misses is not None:
                misses.append(f"{chain.id}: {step.text}")
        for at in range(0, len(typed), BATCH):
            figures.batches += 1
            figures.batches_sent += any(typed[at : at + BATCH])
    return figures


def figures_record(f: Figures) -> dict[str, Any]:
    """The printed columns, unrounded: steps, perception steps, recall, precision, share sent, calls@4."""
    return {"steps": f.steps, "perception": f.perception, "recall": f.recall, "precision": f.precision,
            "sent": f.sent, "calls_per_batch": f.calls}  # fmt: skip


def sources(split: str) -> dict[str, list[LabelledChain]]:
    out = {"hand": load_hand(split), "shapesworld": load_shapesworld(split)}
    if split == "heldout":
        out["fixture"] = load_fixture()  # the fixture's chains are few and fixed: reported once, here
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=SPLITS, default="heldout")
    parser.add_argument("--misses", action="store_true", help="list the perception steps the typer missed")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON (source → typer → figures)")
    args = parser.parse_args(argv)

    if args.json:
        table = {
            source: {name: figures_record(score(chains, typer)) for name, typer in TYPERS.items()}
            for source, chains in sources(args.split).items()
        }
        print(json.dumps({"split": args.split, "figures": table}, indent=2))
        return 0
    print(f"split: {args.split}")
    print(f"{'source':<12} {'typer':<8} {'steps':>5} {'perc.':>5} {'recall':>6} {'prec.':>6} {'sent':>5} calls@4")
    missed: list[str] = []
    for source, chains in sources(args.split).items():
        for name, typer in TYPERS.items():
            f = score(chains, typer, missed if name == "typer" else None)
            print(
                f"{source:<12} {name:<8} {f.steps:>5} {f.perception:>5} {f.recall:>6.3f} {f.precision:>6.3f} "
                f"{f.sent:>5.2f} {f.calls:>7.2f}"
            )
    if args.misses:
        print("\nperception steps typed REASONING:")
        for line in missed:
            print(" ", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
