"""The step typer's model: a logistic score over faithcore.step_features, parameters in step_typer.json.

The parameters are trained offline (benchmarks/evaluation/typer_train.py) and shipped beside this
module; reading that file is the only I/O, once per process.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from faithproxy.faithcore.step_features import step_features

__all__ = ["PARAMS_PATH", "TyperModel", "load_model"]

PARAMS_PATH = Path(__file__).with_name("step_typer.json")


@dataclass(frozen=True)
class TyperModel:
    bias: float
    weights: dict[str, float]
    threshold: float  # P(perception) at or above which a step is a perception candidate

    def probability(self, text: str) -> float:
        """P(perception) of one step's text."""
        z = self.bias + sum(self.weights.get(f, 0.0) for f in step_features(text))
        return 1.0 / (1.0 + math.exp(-z))

    def is_perception(self, text: str) -> bool:
        return self.probability(text) >= self.threshold


@functools.cache
def load_model(path: Path = PARAMS_PATH) -> TyperModel:
    params = json.loads(path.read_text(encoding="utf-8"))
    return TyperModel(float(params["bias"]), dict(params["weights"]), float(params["threshold"]))
