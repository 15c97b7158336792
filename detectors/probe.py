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
from typing import TYPE_CHECKING, Any, ClassVar

from faithproxy.detectors.base import Detector
from faithproxy.faithcore.context import ChainContext
from faithproxy.faithcore.errors import DetectorError, DetectorErrorCode, FaithproxyError, ProbeMismatch
from faithproxy.faithcore.reasoning_formats import ReasoningFormat, get_format
from faithproxy.faithcore.types import Channel, Faithfulness, Step, StepKind, Verdict

if TYPE_CHECKING:
    import numpy as np

    from faithproxy.clients.hidden_states import Features, HiddenStates, HiddenStatesClient
    from faithproxy.detectors.registry import DetectorDeps

# ctx.options key: the request's ReasoningFormat (the server sets it), so that a capture renders the
# chain with the think markers the model saw
REASONING_FORMAT_OPTION = "reasoning_format"
PROBE_FORMAT = "faithproxy-probe"
PROBE_VERSION = 1
RECIPES = ("last_token", "mean_last")

logger = logging.getLogger(__name__)


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


def chain_text(steps: list[Step], fmt: ReasoningFormat | None = None) -> str:
    """The partial assistant message that makes vLLM render `steps` exactly as the model wrote them.

    A reasoning parser moved thinking steps into `reasoning` and dropped the think markers: they are put
    back as the reasoning format says (`ReasoningFormat.model_text`: the opening marker only when the
    model writes it itself, the closing one before the answer). When the generation prompt opens the
    think block (`think_prompt`), a partial assistant message replaces that prompt's tail, so the
    opening marker is written back as the template wrote it; Qwen3's template (`qwen3`) re-renders the
    message with a think block of its own, so nothing is added there. Default format: `think`.
    """
    fmt = fmt or get_format("think")
    by_channel: dict[Channel, str] = {}
    for step in steps:
        by_channel[step.channel] = by_channel.get(step.channel, "") + step.raw
    text = fmt.model_text(by_channel)
    if fmt.prompt_opens_think and not fmt.rewraps_final_message and text:
        text = fmt.think_open + "\n" + text
    return text


def chain_prefix(steps: list[Step], fmt: ReasoningFormat | None = None) -> str:
    """`chain_text` of the steps already accepted (kept for callers of the older name)."""
    return chain_text(steps, fmt)


def capture_texts(accepted: list[Step], new_steps: list[Step], fmt: ReasoningFormat | None) -> tuple[str, list[str]]:
    """(prefix, pieces) for `HiddenStatesClient.step_states`: prefix + pieces[:i+1] is the chain text
    that ends at new step i, markers included, even when the first new step is the chain's first."""
    texts = [chain_text(accepted, fmt)]
    for k in range(1, len(new_steps) + 1):
        texts.append(chain_text([*accepted, *new_steps[:k]], fmt))
    if texts[0] == "" and new_steps:
        # the opening marker, if any, belongs in front of the first step: keep it in the prefix so that
        # the pieces are the steps' own text (the capture of step i ends at its last character)
        first = new_steps[0].raw
        opening = texts[1][: len(texts[1]) - len(first)] if texts[1].endswith(first) else ""
        texts[0] = opening
    pieces = []
    for before, after in zip(texts, texts[1:], strict=False):
        if not after.startswith(before):  # steps out of channel order: fall back to the raw text
            return texts[0], [step.raw for step in new_steps]
        pieces.append(after[len(before) :])
    return texts[0], pieces


class ProbeDetector(Detector):
    """P(unfaithful) from the probe for every perception step; reasoning steps pass as FAITHFUL.

    Per-request options (ctx.options): `probe_threshold` overrides the file's threshold.
    Each perception step's features are kept on the step (`step.features`) for the trace.
    """

    name: ClassVar[str] = "probe"
    description: ClassVar[str] = "classifier over the generator's hidden states (vLLM route 1)"
    reads_hidden_states: ClassVar[bool] = True

    def __init__(self, probe: Probe, hidden: HiddenStatesClient) -> None:
        probe.check_compatible(layers=hidden.layers)
        self.probe = probe
        self.hidden = hidden

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> ProbeDetector | None:
        if deps.probe is None or deps.hidden is None:
            return None  # needs both a probe file and a server that captures hidden states
        return cls(deps.probe, deps.hidden)

    def validate_request(self, ctx: ChainContext) -> None:
        self.probe.check_compatible(model=ctx.model)

    def threshold(self, ctx: ChainContext) -> float:
        value = ctx.options.get("probe_threshold")
        return self.probe.threshold if value is None else float(value)

    async def scores(self, ctx: ChainContext, new_steps: list[Step]) -> list[float | None]:
        """P(unfaithful) of each perception step of `new_steps` (None for reasoning steps)."""
        import numpy as np

        self.validate_request(ctx)
        wanted = [i for i, step in enumerate(new_steps) if step.kind is StepKind.PERCEPTION]
        if not wanted:
            return [None] * len(new_steps)
        key = recipe_key(self.probe.recipe)
        # features of another recipe (a trace's, recorded for training) are read again under the probe's
        todo = [i for i in wanted if new_steps[i].features is None or new_steps[i].features.recipe != key]
        if todo:
            # one capture per step, each ending at that step (earlier new steps are part of its prefix)
            last = todo[-1]
            fmt = ctx.options.get(REASONING_FORMAT_OPTION)
            prefix, pieces = capture_texts(ctx.accepted, new_steps[: last + 1], fmt)
            try:
                captured = await self.hidden.step_states(ctx.model, ctx.messages, prefix, pieces, todo)
            except FaithproxyError as exc:
                raise DetectorError(
                    f"hidden states unavailable: {exc.message}", code=DetectorErrorCode.CONNECTION
                ) from exc
            for i in todo:
                new_steps[i].features = features_of(captured[i], self.probe.recipe)
        try:
            rows = [new_steps[i].features.select(self.probe.layers) for i in wanted]
        except ValueError as exc:
            raise DetectorError(str(exc), code=DetectorErrorCode.OTHER) from exc
        probabilities = self.probe.predict(np.stack(rows))
        out: list[float | None] = [None] * len(new_steps)
        for i, p in zip(wanted, probabilities, strict=True):
            out[i] = float(p)
        return out

    async def check(self, ctx: ChainContext, new_steps: list[Step]) -> list[Verdict]:
        started = time.perf_counter()
        scores = await self.scores(ctx, new_steps)
        latency = time.perf_counter() - started
        threshold = self.threshold(ctx)
        verdicts = []
        for step, score in zip(new_steps, scores, strict=True):
            if score is None:
                verdicts.append(Verdict(Faithfulness.FAITHFUL, self.name, kind=step.kind, latency_s=latency))
                continue
            faithfulness = Faithfulness.UNFAITHFUL if score > threshold else Faithfulness.FAITHFUL
            verdicts.append(
                Verdict(faithfulness, self.name, kind=step.kind, reason="probe", latency_s=latency, score=score)
            )
        return verdicts


async def record_features(hidden: HiddenStatesClient, ctx: ChainContext, steps: list[Step]) -> None:
    """Reads the features of the perception steps of `steps` that have none (for the trace: probes are
    trained from traces whose steps carry a judge's verdicts). Failures only leave them without."""
    from faithproxy.clients.hidden_states import Features

    todo = [i for i, s in enumerate(steps) if s.kind is StepKind.PERCEPTION and s.features is None]
    if not todo:
        return
    prefix, pieces = capture_texts(ctx.accepted, steps[: todo[-1] + 1], ctx.options.get(REASONING_FORMAT_OPTION))
    try:
        captured = await hidden.step_states(ctx.model, ctx.messages, prefix, pieces, todo)
    except FaithproxyError as exc:
        logger.warning("request %s: no features recorded: %s", ctx.request_id, exc.message)
        return
    for i in todo:
        steps[i].features = Features.last_token(captured[i])
