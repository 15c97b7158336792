"""`faithproxy bench validate` and `faithproxy bench score`: a benchmark's release and predictions, no model.

    faithproxy bench validate --dataset hallusionbench --data-dir ~/data/HallusionBench
    faithproxy bench score --dataset mmevalpro --data-dir ~/data/MMEvalPro --predictions demo_model_output.json

`validate` reads the release as published (datasets/release.py) and prints, as JSON, the records per
split and every problem (missing or unreadable images, records that cannot be read, unknown field
values, duplicates); the exit status is 1 when there is any, 0 otherwise.

`score` scores a predictions file with the dataset's official rules and prints the figures as JSON. The
file may be in the benchmark's own output format where it has one (each dataset module's `from_official`
or `score_official` says which: MMVP's answer.jsonl, HallusionBench's result JSON, MMEvalPro's model
output JSON, MM-GCoT's result JSONL, MIRAGE's evaluated TSV), or ours: the `predictions.jsonl` that
`bench run` writes (`{"id", "text", "reasoning", ...}` per line), with `--judgements` for the judge's
fields of a judged run. Only the items the file answers are scored, as the official scripts do; how
many items it leaves out, and how many of its rows match no item, is reported beside the figures.
Images are not checked: scoring needs the records, not the pixels.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation import datasets
from faithproxy.benchmarks.evaluation.datasets.release import (
    DatasetError,
    images_unchecked,
    read_json_records,
    read_tsv_rows,
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help=f"one of: {', '.join(datasets.DATASETS)}")
    parser.add_argument("--data-dir", required=True, type=Path, help="the release as unpacked (docs/datasets.md)")
    parser.add_argument(
        "--loader-arg", action="append", default=[], metavar="KEY=VALUE", help="dataset option (repeatable)"
    )


def _module_and_options(args: argparse.Namespace) -> tuple[Any, dict[str, str]]:
    from faithproxy.benchmarks.evaluation.run import loader_options

    module = datasets.get(args.dataset)
    return module, loader_options(module, args.dataset, args.loader_arg)


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 2


class Validate:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        try:
            module, options = _module_and_options(args)
            release = module.read(args.data_dir, **options)
        except (KeyError, ValueError) as exc:
            return _fail(exc.args[0] if exc.args else str(exc))
        report = {"data_dir": str(args.data_dir), **release.report()}
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return 1 if release.problems else 0


def read_records(path: Path) -> list[Any]:
    if path.suffix.lower() == ".tsv":
        return [row for _, row in read_tsv_rows(path)]
    return read_json_records(path)


def score_file(module: Any, items: list[Any], records: list[Any], judgements: list[Any]) -> dict[str, Any]:
    """The figures for a predictions file: the official format when the dataset recognises it, ours else."""
    if hasattr(module, "score_official") and (official := module.score_official(records, items)) is not None:
        return {"format": "official", "metrics": official}
    predictions = module.from_official(records, items) if hasattr(module, "from_official") else None
    form = "official"
    if predictions is None:
        form = "ours"
        predictions = {str(r["id"]): r for r in records if isinstance(r, dict) and "id" in r}
    for record in judgements:
        if isinstance(record, dict) and str(record.get("id")) in predictions:
            key = str(record["id"])
            predictions[key] = {**predictions[key], **{k: v for k, v in record.items() if k != "id"}}
    answered = [i for i in items if i.id in predictions]
    return {
        "format": form,
        "items_scored": len(answered),
        "items_without_prediction": len(items) - len(answered),
        "predictions_unmatched": len(set(predictions) - {i.id for i in items}),
        "metrics": module.score(answered, predictions),
    }


class Score:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        _common(parser)
        parser.add_argument("--predictions", required=True, type=Path, help="the official output file, or ours")
        parser.add_argument("--judgements", type=Path, help="judgements.jsonl of a judged `bench run`")

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        try:
            module, options = _module_and_options(args)
            with images_unchecked():
                release = module.read(args.data_dir, **options)
            if not args.predictions.exists():
                return _fail(f"no predictions file at {args.predictions}")
            records = read_records(args.predictions)
            judgements = read_json_records(args.judgements) if args.judgements else []
            result = score_file(module, release.items, records, judgements)
        except DatasetError as exc:
            return _fail(str(exc))
        except (KeyError, ValueError) as exc:
            return _fail(exc.args[0] if exc.args else str(exc))
        if result.get("items_scored") == 0:
            return _fail(f"{args.predictions} answers none of the {len(release.items)} items of the release")
        out = {
            "dataset": release.dataset,
            "predictions": str(args.predictions),
            **result,
            "release_problems": release.problem_counts,
        }
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return 0
