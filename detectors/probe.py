"""`probe`: a classifier over the generator's own hidden states gives P(unfaithful) for each step.

The paper's white-box baseline (SAPLMA-style): cheap (no second model, one short prefill per step) and
weaker than a judge; the cascade uses it as a first stage. Features come from the vLLM that serves
the chain (clients/hidden_states.py, route 1). The probe file's recipe says how a step's captured
states become its features, and the detector computes exactly that (`features_of`): `last_token`, the
chosen layers' residual stream at the step's last token, concatenated; `mean_last` with `tokens: k`,
each layer's mean over the step's last k tokens (no tokenizer needed: the capture ends at the step).

A probe file is JSON, versioned and self-describing:

    {"format": "faithproxy-probe", "version": 1,
     "model": served model name the features came from, "model_digest": optional weights digest,
     "layers": [vLLM layer ids], "hidden_size": H,
     "recipe": {"name": "last_token" | "mean_last", "tokens": k (mean_last), "standardize": true},
     "classifier": {"kind": "logistic" | "mlp", "mean": [...], "std": [...], "weights": ..., ...},
     "threshold": P above which a step is unfaithful,
     "training": {"data_sha256", "n_train", "n_val", "positives", "imbalance": how it was handled, ...},
     "validation": {"precision", "recall", "f1", "auroc", "by_position": {...}}}

A probe is refused (ProbeMismatch, HTTP 409) for a request to another model, and at load time when
the server does not capture every layer it needs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from faithproxy.detectors.base import Detector
from faithproxy.detectors.features import capture_texts
from faithproxy.detectors.options import DetectorOption, probability
from faithproxy.faithcore.context import CheckResult, RequestView
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode, FaithproxyError, ProbeMismatch
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict

if TYPE_CHECKING:
    import numpy as np

    from faithproxy.clients.hidden_states import Features, HiddenStates, HiddenStatesClient
    from faithproxy.detectors.base import DetectorDeps

THRESHOLD_OPTION = "probe_threshold"  # RequestView.options key: the request's threshold (a header)
PROBE_FORMAT = "faithproxy-probe"
PROBE_VERSION = 1
RECIPES = ("last_token", "mean_last")

logger = logging.getLogger(__name__)


class Scored(NamedTuple):
    """The probe's scores of a batch (None for a reasoning step) and the features they were read from
    (one per step, None where none was read; None for a batch without perception steps)."""

    scores: list[float | None]
    features: tuple[Features | None, ...] | None


class ProbeFileError(ValueError):
    """A probe file that cannot be read (wrong format, version, or shape)."""


def recipe_key(recipe: Mapping[str, Any]) -> str:
    """The recipe's short name, as feature traces label their vectors: `last_token`, `mean_last_4`."""
    if recipe.get("name") == "mean_last":
        return f"mean_last_{int(recipe['tokens'])}"
    return str(recipe.get("name"))


def parse_recipe(key: str) -> dict[str, Any]:
    """`last_token` or `mean_last_K` → the recipe dict a probe file stores."""
    if key == "last_token":
        return {"name": "last_token", "standardize": True}
    head, _, tokens = key.rpartition("_")
    if head == "mean_last" and tokens.isdigit() and int(tokens) >= 1:
        return {"name": "mean_last", "tokens": int(tokens), "standardize": True}
    raise ProbeFileError(f"unknown feature recipe {key!r} (known: last_token, mean_last_K with K >= 1)")


def recorded_features(step: Mapping[str, Any], recipe: str = "last_token") -> Features | None:
    """The features of recipe `recipe` (a `recipe_key`) a recorded step carries, or None: its `features`
    (a proxy trace's, or probe_bench collect's `last_token`) or its `features_by_recipe` entry."""
    from faithproxy.clients.hidden_states import Features

    features = step.get("features")
    if isinstance(features, Mapping) and features.get("recipe", "last_token") == recipe:
        return Features.from_json(dict(features))
    extra = step.get("features_by_recipe")
    chosen = extra.get(recipe) if isinstance(extra, Mapping) else None
    return Features.from_json(dict(chosen)) if isinstance(chosen, Mapping) else None


def features_of(states: HiddenStates, recipe: Mapping[str, Any]) -> Features:
    """A step's features under `recipe`, from the capture that ends at the step's last token."""
    from faithproxy.clients.hidden_states import Features

    if recipe.get("name") == "last_token":
        return Features.last_token(states)
    if recipe.get("name") == "mean_last":
        tokens = int(recipe["tokens"])
        vectors = states.states[-tokens:].mean(axis=0, dtype="float64").astype("float32")
        return Features(vectors, list(states.layers), recipe_key(recipe))
    raise ProbeFileError(f"unknown feature recipe {recipe.get('name')!r} (known: {', '.join(RECIPES)})")


@dataclass
class Probe:
    """A trained probe: `predict(features) -> P(unfaithful)` plus everything needed to trust it."""

    model: str
    layers: list[int]
    hidden_size: int
    classifier: dict[str, Any]
    threshold: float = 0.5
    recipe: dict[str, Any] = field(default_factory=lambda: {"name": "last_token", "standardize": True})
    model_digest: str | None = None
    training: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] = field(default_factory=dict)

    @property
    def input_size(self) -> int:
        return self.hidden_size * len(self.layers)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """P(unfaithful) for each row of `features` [n, len(layers) * hidden_size]."""
        import numpy as np

        x = np.asarray(features, dtype=np.float64)
        if x.ndim == 1:
            x = x[None]
        if x.shape[1] != self.input_size:
            raise ProbeMismatch(
                f"probe expects {self.input_size} features ({len(self.layers)} layers x {self.hidden_size}), "
                f"got {x.shape[1]}"
            )
        c = self.classifier
        x = (x - np.asarray(c["mean"])) / np.asarray(c["std"])
        if c["kind"] == "logistic":
            z = x @ np.asarray(c["weights"]) + float(c["bias"])
        elif c["kind"] == "mlp":
            h = np.maximum(0.0, x @ np.asarray(c["w1"]) + np.asarray(c["b1"]))
            z = h @ np.asarray(c["w2"]) + float(c["b2"])
        else:
            raise ProbeFileError(f"unknown classifier kind {c['kind']!r}")
        return 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))

    def check_compatible(self, model: str | None = None, layers: list[int] | None = None) -> None:
        """ProbeMismatch unless the probe was trained for `model` and every layer it reads is in `layers`."""
        if model is not None and model != self.model:
            raise ProbeMismatch(
                f"the probe was trained on hidden states of model {self.model!r}, not {model!r}; "
                "train one for this model (faithproxy probe train) or choose another detector",
                param="model",
            )
        if layers is not None:
            missing = [layer for layer in self.layers if layer not in layers]
            if missing:
                raise ProbeMismatch(
                    f"the probe reads layers {self.layers} but the server captures {layers} "
                    f"(missing {missing}); start vLLM with those layers or retrain the probe"
                )

    # ---- file format --------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PROBE_FORMAT,
            "version": PROBE_VERSION,
            "model": self.model,
            "model_digest": self.model_digest,
            "layers": list(self.layers),
            "hidden_size": self.hidden_size,
            "recipe": self.recipe,
            "classifier": _lists(self.classifier),
            "threshold": self.threshold,
            "training": self.training,
            "validation": self.validation,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Probe:
        if not isinstance(data, dict) or data.get("format") != PROBE_FORMAT:
            raise ProbeFileError(f"not a faithproxy probe file (format {data.get('format')!r})")
        if data.get("version") != PROBE_VERSION:
            raise ProbeFileError(f"probe file version {data.get('version')!r}; this faithproxy reads {PROBE_VERSION}")
        recipe = data.get("recipe") or {}
        if recipe.get("name") not in RECIPES:
            raise ProbeFileError(f"unknown feature recipe {recipe.get('name')!r} (known: {', '.join(RECIPES)})")
        if recipe["name"] == "mean_last" and not (isinstance(recipe.get("tokens"), int) and recipe["tokens"] >= 1):
            raise ProbeFileError(f"recipe mean_last needs a whole number of tokens >= 1, not {recipe.get('tokens')!r}")
        try:
            probe = cls(
                model=str(data["model"]),
                layers=[int(layer) for layer in data["layers"]],
                hidden_size=int(data["hidden_size"]),
                classifier=dict(data["classifier"]),
                threshold=float(data["threshold"]),
                recipe=recipe,
                model_digest=data.get("model_digest"),
                training=dict(data.get("training") or {}),
                validation=dict(data.get("validation") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProbeFileError(f"probe file is missing or has a malformed field: {exc}") from exc
        if not 0.0 <= probe.threshold <= 1.0:
            raise ProbeFileError(f"threshold {probe.threshold} is not a probability")
        size = len(probe.classifier.get("mean") or [])
        if size != probe.input_size:
            raise ProbeFileError(f"classifier has {size} inputs, layers x hidden_size is {probe.input_size}")
        return probe

    @classmethod
    def load(cls, path: str | Path) -> Probe:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ProbeFileError(f"cannot read probe file {path}: {exc}") from exc
        return cls.from_json(data)


def _lists(value: Any) -> Any:
    """numpy arrays (and their scalars) in a classifier dict → plain JSON lists and floats."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


class ProbeDetector(Detector):
    """P(unfaithful) from the probe for every perception step; reasoning steps pass as FAITHFUL.

    Per-request options (view.options): `probe_threshold` overrides the file's threshold.
    The features read for each perception step come back in the CheckResult (the driver keeps them on
    the step for the trace); a step that already carries features of the probe's recipe (a replayed
    trace's) is not captured again.
    """

    name: ClassVar[str] = "probe"
    description: ClassVar[str] = "classifier over the generator's hidden states (vLLM route 1)"
    reads_hidden_states: ClassVar[bool] = True
    options: ClassVar[tuple[DetectorOption, ...]] = (
        DetectorOption(THRESHOLD_OPTION, "x-faithproxy-probe-threshold", probability, "a probability from 0 to 1"),
    )

    def __init__(self, probe: Probe, hidden: HiddenStatesClient) -> None:
        probe.check_compatible(layers=hidden.layers)
        self.probe = probe
        self.hidden = hidden

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> ProbeDetector | None:
        """The probe file is read here (a bad file stops the server's start); None without both a probe
        and a server that captures hidden states."""
        probe = deps.probe
        if probe is None and deps.probe_path:
            probe = Probe.load(deps.probe_path)
        if probe is None or deps.hidden is None:
            return None
        return cls(probe, deps.hidden)

    def validate_request(self, view: RequestView) -> None:
        self.probe.check_compatible(model=view.model)

    def threshold(self, view: RequestView) -> float:
        value = view.options.get(THRESHOLD_OPTION)
        return self.probe.threshold if value is None else float(value)

    async def scores(self, view: RequestView, new_steps: list[Step]) -> Scored:
        """P(unfaithful) of each perception step of `new_steps` (None for reasoning steps), and the
        features each was scored on."""
        import numpy as np

        self.validate_request(view)
        wanted = [i for i, step in enumerate(new_steps) if step.kind is StepKind.PERCEPTION]
        if not wanted:
            return Scored([None] * len(new_steps), None)
        key = recipe_key(self.probe.recipe)
        features: dict[int, Features] = {i: new_steps[i].features for i in wanted if new_steps[i].features is not None}
        # features of another recipe (a trace's, recorded for training) are read again under the probe's
        todo = [i for i in wanted if i not in features or features[i].recipe != key]
        if todo:
            features |= await self._capture(view, new_steps, todo)
        try:
            rows = [features[i].select(self.probe.layers) for i in wanted]
        except ValueError as exc:
            raise DetectorError(str(exc), code=DetectorErrorCode.OTHER) from exc
        probabilities = self.probe.predict(np.stack(rows))
        out: list[float | None] = [None] * len(new_steps)
        for i, p in zip(wanted, probabilities, strict=True):
            out[i] = float(p)
        return Scored(out, tuple(features.get(i) for i in range(len(new_steps))))

    async def _capture(self, view: RequestView, new_steps: list[Step], todo: list[int]) -> dict[int, Features]:
        """One capture per step of `todo`, each ending at that step (earlier new steps are part of its
        prefix), as the probe's recipe reads it."""
        prefix, pieces = capture_texts(view.accepted, new_steps[: todo[-1] + 1], view.reasoning_format)
        try:
            captured = await self.hidden.step_states(view.model, view.messages, prefix, pieces, todo)
        except FaithproxyError as exc:
            raise DetectorError(f"hidden states unavailable: {exc.message}", code=DetectorErrorCode.CONNECTION) from exc
        return {i: features_of(captured[i], self.probe.recipe) for i in todo}

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        started = time.perf_counter()
        scores, features = await self.scores(view, new_steps)
        latency = time.perf_counter() - started
        threshold = self.threshold(view)
        verdicts = []
        for step, score in zip(new_steps, scores, strict=True):
            if score is None:
                verdicts.append(Verdict(Faithfulness.FAITHFUL, self.name, kind=step.kind, latency_s=latency))
                continue
            faithfulness = Faithfulness.UNFAITHFUL if score > threshold else Faithfulness.FAITHFUL
            verdicts.append(
                Verdict(faithfulness, self.name, kind=step.kind, reason="probe", latency_s=latency, score=score)
            )
        return CheckResult(tuple(verdicts), features=features)
