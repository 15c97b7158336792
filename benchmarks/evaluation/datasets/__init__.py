"""Benchmark loaders and scorers, by name: `get("mmvp").load(data_dir)` / `.score(items, predictions)`.

Every benchmark module has

- `load(data_dir: Path, **options) -> list[Item]`: reads the benchmark's published files from a local
  directory (no hub); `options` are the module's own settings (strings, from `--loader-arg k=v`);
- `score(items, predictions) -> dict`: the benchmark's metrics. `predictions` maps item id to the
  prediction record `bench run` writes (`{"id", "text", "reasoning", "error", ...}`) or to a plain reply
  string. A missing prediction, or one with an error, counts as wrong. A ratio over an empty set is None;
- `correct(item, prediction) -> bool | None`: whether one answer is right (None: cannot be told yet,
  e.g. a free-form reply not judged); `bench run` records it on each chain it writes;
- optionally `async judge(items, predictions, judge) -> dict[id, dict]`: calls a judge backend
  (`clients.judges`) for what the metrics need beyond string matching; `bench run` merges the returned
  fields into the prediction records before scoring.

The registry is lazy (module paths, imported on first use), takes names in any case, and suggests a
name on a typo.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from faithproxy.faithcore.registry import Entry, Registry, UnknownName

_PACKAGE = "faithproxy.benchmarks.evaluation.datasets"

DATASETS: Registry[ModuleType] = Registry(
    "dataset",
    ModuleType,
    {
        "mmvp": Entry(f"{_PACKAGE}.mmvp", "MMVP: two-option questions on pairs of CLIP-blind images"),
        "hallusionbench": Entry(f"{_PACKAGE}.hallusionbench", "HallusionBench: yes/no questions on figures"),
        "mmevalpro": Entry(f"{_PACKAGE}.mmevalpro", "MMEvalPro: multiple-choice question triplets"),
        "freak": Entry(f"{_PACKAGE}.freak", "FREAK: images that contradict common sense, multiple choice or free form"),
        "mmgcot": Entry(f"{_PACKAGE}.mmgcot", "MM-GCoT: answers scored with the box they rest on"),
        "mirage": Entry(f"{_PACKAGE}.mirage", "MIRAGE: hallucinations in multimodal reasoning chains"),
    },
    fold_case=True,
)


@dataclass(frozen=True)
class Item:
    """One question as it is sent to the model.

    `question` is the benchmark's own wording; `prompt` the whole text sent (question, options, the
    setting's instruction); `answer` the gold answer in the form the scorer compares (a letter for
    multiple choice); `extra` whatever else that benchmark's scorer needs (pairs, groups, boxes, ...).
    """

    id: str
    question: str
    prompt: str
    answer: str
    image: Path | None = None
    options: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


Prediction = Mapping[str, Any] | str | None


def get(name: str) -> ModuleType:
    """The benchmark module registered as `name`; KeyError naming the known ones otherwise."""
    try:
        return DATASETS.resolve(name)
    except UnknownName as exc:
        # `bench run` prints this line to its user: the known names first, then the suggestion
        did_you_mean = f" Did you mean {exc.hint!r}?" if exc.hint else ""
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}.{did_you_mean}") from None


def reply_text(prediction: Prediction) -> str | None:
    """The whole reply to read an answer from: reasoning (as a `<think>` block) then content.

    None for a missing prediction or one that failed.
    """
    if prediction is None or isinstance(prediction, str):
        return prediction
    if prediction.get("error"):
        return None
    content = prediction.get("text") or ""
    reasoning = prediction.get("reasoning") or ""
    return f"<think>{reasoning}</think>{content}" if reasoning else content


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, or None over an empty set."""
    return numerator / denominator if denominator else None


def require_file(path: Path, what: str) -> Path:
    """`path`, or FileNotFoundError saying which published file was expected there."""
    if not path.exists():
        raise FileNotFoundError(f"{what}: expected {path} (see the loader's docstring for the layout)")
    return path
