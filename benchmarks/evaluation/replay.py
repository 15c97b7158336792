"""Offline replay: run any registered detector over recorded chains and score it against their labels.

Each chain is checked the way the proxy checks a live one (server/chain/session.py), minus regeneration:
its steps, typed by the proxy's keyword typer (or by the gold kinds, `kinds="gold"`), go to the
detector in batches of up to `batch` steps, with the steps already checked as the view's `accepted`. A
detector that stops at the first unfaithful step (the judge) marks the steps after it as not reached:
replay keeps the flagged step as it is (nothing is rewritten offline) and asks again about the rest,
so every step gets a verdict. Chains run concurrently, at most `concurrency` at a time; the steps of one
chain run in order.

Predictions are labelled chains (benchmarks/evaluation/labelled.py): the gold chain's fields, each step's kind as
the detector left it, `faithful` from its verdict (null for reasoning steps and for steps it could not
decide), `score` when the detector gives one, and the verdict's detector, reason and call latency as
extra step fields. A failed detector call (any `FaithproxyError`: the judge or the generator failed)
leaves its steps unlabelled and is counted; it never stops the replay.

Images: a chain's `image` that names a readable file (absolute, or relative to `image_dir`) is sent as
a data URL; a bare sha256 is looked up among the files of `image_dir` by content hash. A chain whose
image cannot be found is judged without it, and counted (`images_missing`).

Probe and cascade (`probe_replay_deps`): replay captures no hidden states; it reads the features the
chains' steps carry (`features` / `features_by_recipe`, as `probe_bench collect` writes them and proxy
traces recorded with FAITHPROXY_RECORD_FEATURES=true hold them). A probe whose model, layers, width or
recipe the recorded features do not match is refused before anything runs; a step the detector wants
features for that has none is a failed call (counted in `errors`). For the cascade the report counts
the perception steps each stage decided (`decided_by`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import mimetypes
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from faithproxy.benchmarks.evaluation.labelled import KINDS, LabelledChain, LabelledStep
from faithproxy.benchmarks.evaluation.metrics import f1_by_position, step_f1, upr
from faithproxy.detectors.base import Detector
from faithproxy.detectors.probe import Probe, recipe_key, recorded_features
from faithproxy.detectors.registry import DETECTORS, DetectorDeps, build_detectors, resolve
from faithproxy.faithcore.context import RequestView, Usage
from faithproxy.faithcore.errors import (
    BenchmarkError,
    DetectorError,
    FaithproxyError,
    UpstreamError,
    UpstreamErrorCode,
)
from faithproxy.faithcore.images import ImageRef, parse_image_url
from faithproxy.faithcore.kinds import classify_step
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict

Kinds = Literal["heuristic", "gold"]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# an UNSURE flag (under the judge's threshold) is not acted on, and not a label either way
_LABEL = {
    Faithfulness.FAITHFUL: True,
    Faithfulness.UNFAITHFUL: False,
    Faithfulness.UNKNOWN: None,
    Faithfulness.UNSURE: None,
}


class ReplayError(BenchmarkError):
    """A replay that cannot start (unknown detector, missing judge or generator); the message says why."""


def make_detector(
    name: str, *, judges: Mapping[str, Any] | None = None, default_judge: str | None = None, **deps: Any
) -> Detector:
    """One detector from the registry, built the way the server builds it.

    `judges` are handed over only to detectors that declare `uses_judge`; `deps` are further
    `DetectorDeps` fields (a loaded `probe` and a `hidden` states client, for those that declare
    `reads_hidden_states`; the `generator` client, for the prompt detector).
    """
    entry = DETECTORS.get(name)
    if entry is None:
        try:
            resolve(name)
        except KeyError as exc:  # the registry's message, with its "did you mean"
            raise ReplayError(str(exc.args[0])) from exc
    assert entry is not None
    cls = resolve(name)
    uses_judges = cls.uses_judge
    built = build_detectors(
        DetectorDeps(judges=dict(judges or {}) if uses_judges else {}, default_judge=default_judge, **deps)
    )
    if name not in built:
        needs = ["a judge (--judges or FAITHPROXY_JUDGES)"] if uses_judges and not judges else []
        if cls.reads_hidden_states:
            needs.append("a probe file and a hidden-states client")
        raise ReplayError(f"detector {name!r} needs " + (" and ".join(needs) or "dependencies replay lacks"))
    return built[name]


class ImageResolver:
    """Finds the bytes of a chain's image (a path, or a sha256 of a file under `image_dir`)."""

    def __init__(self, image_dir: str | Path | None = None) -> None:
        self.image_dir = Path(image_dir) if image_dir is not None else None
        self._by_hash: dict[str, Path] | None = None
        self._cache: dict[str, ImageRef | None] = {}

    def _index(self) -> dict[str, Path]:
        if self._by_hash is None:
            self._by_hash = {}
            if self.image_dir is not None and self.image_dir.is_dir():
                for path in sorted(self.image_dir.rglob("*")):
                    if path.is_file():
                        self._by_hash[hashlib.sha256(path.read_bytes()).hexdigest()] = path
        return self._by_hash

    def _path_of(self, image: str) -> Path | None:
        candidates = [Path(image)]
        if self.image_dir is not None:
            candidates.append(self.image_dir / image)
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        if _SHA256.match(image):
            return self._index().get(image)
        return None

    def resolve(self, image: str | None) -> ImageRef | None:
        if image is None:
            return None
        if image not in self._cache:
            path = self._path_of(image)
            if path is None:
                self._cache[image] = None
            else:
                media = mimetypes.guess_type(path.name)[0] or "image/png"
                data = base64.b64encode(path.read_bytes()).decode()
                self._cache[image] = parse_image_url(f"data:{media};base64,{data}")
        return self._cache[image]


@dataclass
class ChainReplay:
    """What replaying one chain produced and cost."""

    prediction: LabelledChain
    calls: int = 0
    call_latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    image_missing: bool = False
    generator_tokens: int = 0


@dataclass
class ReplayReport:
    detector: str
    judge: str | None
    chains: int
    steps: int
    detector_calls: int
    judge_calls: int | None  # calls the judge backend received (None: the detector has no judge)
    judge_input_tokens: int | None
    judge_output_tokens: int | None
    generator_tokens: int  # tokens the generator spent on checks (the prompt detector)
    latency_mean_s: float | None  # one detector call
    latency_p50_s: float | None
    latency_p95_s: float | None
    detector_s_per_step: float | None  # time spent in detector calls / steps replayed
    wall_s: float
    errors: int
    images_missing: int
    upr_gold: float | None
    upr_predicted: float | None
    f1: dict[str, Any]  # benchmarks.metrics.F1Result.to_dict() against the input's labels
    f1_by_position: dict[str, Any]  # the unfaithful class on steps i <= 2 and i > 2
    # the cascade: perception steps whose final verdict each stage gave ({"probe": n, "judge": m}); else None
    decided_by: dict[str, int] | None = None
    probe_decided_share: float | None = None  # decided_by["probe"] / all decided

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _messages(question: str, image: ImageRef | None) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": image.url}})
    content.append({"type": "text", "text": question})
    return [{"role": "user", "content": content}]


def _steps_of(chain: LabelledChain, kinds: Kinds, recipe: str | None = None) -> list[Step]:
    """The chain's steps as the session would hold them; with `recipe`, each carries its recorded features."""
    steps = []
    for i, s in enumerate(chain.steps):
        if kinds == "gold" and s.kind in KINDS:
            kind = StepKind(s.kind)
        else:
            kind = classify_step(s.text)
        step = Step(index=i, text=s.text, raw=s.text, kind=kind)
        if recipe is not None:
            step.features = recorded_features(s.extra, recipe)
        steps.append(step)
    return steps


def _probe_of(detector: Detector) -> Probe | None:
    """The probe file behind a detector that reads hidden states (the probe, or the cascade's probe stage)."""
    stage = getattr(detector, "probe", None)
    probe = getattr(stage, "probe", stage)
    return probe if detector.reads_hidden_states and isinstance(probe, Probe) else None


class RecordedHiddenStates:
    """Stands in for the hidden-states client in replay: the features are the ones the steps carry, so a
    step without them is a failed call (no vLLM to read them from), never a silent score."""

    def __init__(self, layers: list[int]) -> None:
        self.layers = list(layers)

    async def step_states(self, *args: Any, **kwargs: Any) -> Any:
        raise UpstreamError(
            "this perception step has no recorded features (replay reads features, it captures none: record "
            "with FAITHPROXY_RECORD_FEATURES=true or probe_bench collect, or replay with --kinds gold)",
            code=UpstreamErrorCode.NO_HIDDEN_STATES,
        )


def probe_replay_deps(chains: Sequence[LabelledChain], probe: Probe, model: str | None = None) -> dict[str, Any]:
    """The `probe` and `hidden` DetectorDeps for replaying the probe or the cascade over `chains`.

    ReplayError, before anything runs, when the probe cannot read the chains' recorded features: another
    model, layers the features lack, another hidden size, another recipe, or no features at all.
    """
    models = {model} if model else {str(c.extra["model"]) for c in chains if c.extra.get("model")}
    others = sorted(m for m in models if m != probe.model)
    if others:
        raise ReplayError(f"the probe was trained on hidden states of model {probe.model!r}; the chains are of "
                          f"{', '.join(map(repr, others))}")  # fmt: skip
    recipe = recipe_key(probe.recipe)
    first, recorded, other_recipes = None, 0, set()
    for chain in chains:
        for step in chain.steps:
            features = recorded_features(step.extra, recipe)
            if features is not None:
                recorded += 1
                first = first or features
            elif step.extra.get("features") or step.extra.get("features_by_recipe"):
                other_recipes.add(str((step.extra.get("features") or {}).get("recipe", "last_token")))
                other_recipes.update(step.extra.get("features_by_recipe") or {})
    if first is None:
        found = f" (they carry {', '.join(sorted(other_recipes))})" if other_recipes else ""
        raise ReplayError(f"no step of the chains carries features of the probe's recipe {recipe!r}{found}: "
                          "record them with FAITHPROXY_RECORD_FEATURES=true or probe_bench collect")  # fmt: skip
    missing = [layer for layer in probe.layers if layer not in first.layers]
    if missing:
        raise ReplayError(f"the probe reads layers {probe.layers}; the recorded features hold layers "
                          f"{first.layers} (missing {missing})")  # fmt: skip
    if first.vectors.shape[-1] != probe.hidden_size:
        raise ReplayError(f"the probe expects hidden size {probe.hidden_size}; the recorded features have "
                          f"{first.vectors.shape[-1]}")  # fmt: skip
    return {"probe": probe, "hidden": RecordedHiddenStates(first.layers)}


def _accepted_count(verdicts: Sequence[Verdict]) -> int:
    """How many verdicts stand: all of them, except the not-reached ones after an unfaithful step."""
    flagged = next((i for i, v in enumerate(verdicts) if v.unfaithful), None)
    if flagged is None:
        return len(verdicts)
    for i in range(flagged + 1, len(verdicts)):
        if verdicts[i].faithfulness is Faithfulness.UNKNOWN:
            return i
    return len(verdicts)


def _predicted_step(step: Step, source: LabelledStep, latency: float | None, error: str | None) -> LabelledStep:
    verdict = step.verdict
    extra: dict[str, Any] = {}
    faithful: bool | None = None
    score: float | None = None
    if verdict is not None:
        if step.kind is StepKind.PERCEPTION:
            faithful = _LABEL[verdict.faithfulness]
        score = verdict.score
        extra = {"verdict": verdict.faithfulness.value, "detector": verdict.detector, "reason": verdict.reason}
        if verdict.confidence is not None:  # a judge's confidence in its flag (bench calibrate reads it)
            extra["confidence"] = verdict.confidence
    if latency is not None:
        extra["latency_s"] = round(latency, 6)
    if error is not None:
        extra["error"] = error
    return LabelledStep(source.text, step.kind.value, faithful, score, extra)


async def replay_chain(
    chain: LabelledChain,
    detector: Detector,
    *,
    judge: str | None = None,
    model: str | None = None,
    images: ImageResolver | None = None,
    batch: int = 16,
    kinds: Kinds = "heuristic",
) -> ChainReplay:
    """Every step of `chain` through `detector` (see the module docstring); a failed call is recorded, not raised."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    image = (images or ImageResolver()).resolve(chain.image)
    view = RequestView(
        request_id=chain.id,
        model=model or str(chain.extra.get("model") or "unknown"),
        messages=_messages(chain.question, image),
        question=chain.question,
        images=(image,) if image is not None else (),
        judge=judge,
    )
    usage = Usage()  # generator tokens the checks spent (the prompt detector)
    probe = _probe_of(detector)
    steps = _steps_of(chain, kinds, recipe_key(probe.recipe) if probe is not None else None)
    latency: dict[int, float] = {}
    errors: dict[int, str] = {}
    out = ChainReplay(LabelledChain(chain.id, chain.question, image=chain.image, answer=chain.answer,
                                    gold_answer=chain.gold_answer))  # fmt: skip
    out.image_missing = chain.image is not None and image is None
    pos = 0
    while pos < len(steps):
        pending = steps[pos : pos + batch]
        if not detector.types_steps and not any(s.kind is StepKind.PERCEPTION for s in pending):
            view = view.with_accepted([*view.accepted, *pending])  # the proxy would not call it for them either
            pos += len(pending)
            continue
        started = time.perf_counter()
        try:
            result = await detector.check(view, pending)
            verdicts = result.verdicts
            usage.add(result.usage)
            if len(verdicts) != len(pending):
                raise DetectorError(f"{len(verdicts)} verdicts for {len(pending)} steps")
        except FaithproxyError as exc:
            elapsed = time.perf_counter() - started
            out.calls += 1
            out.call_latencies.append(elapsed)
            out.errors.append(exc.message)
            for step in pending:
                latency[step.index], errors[step.index] = elapsed, exc.message
            view = view.with_accepted([*view.accepted, *pending])
            pos += len(pending)
            continue
        elapsed = time.perf_counter() - started
        out.calls += 1
        out.call_latencies.append(elapsed)
        keep = max(_accepted_count(verdicts), 1)
        for step, verdict in zip(pending[:keep], verdicts[:keep], strict=True):
            if verdict.kind is not None:
                step.kind = verdict.kind
            step.verdict = step.first_verdict = verdict
            latency[step.index] = elapsed
        view = view.with_accepted([*view.accepted, *pending[:keep]])
        pos += keep
    out.prediction.steps = [
        _predicted_step(step, source, latency.get(step.index), errors.get(step.index))
        for step, source in zip(steps, chain.steps, strict=True)
    ]
    out.prediction.extra = {"replay": {"detector": detector.name, "judge": judge, "calls": out.calls}}
    out.generator_tokens = usage.prompt_tokens + usage.completion_tokens
    return out


def _decided_by(predictions: Sequence[LabelledChain]) -> dict[str, int]:
    """Which cascade stage gave each perception step its final verdict (steps a stage passed over as not
    reached, then asked again, count once: for the stage that decided them)."""
    counts = {"probe": 0, "judge": 0}
    for chain in predictions:
        for step in chain.steps:
            reason = step.extra.get("reason")
            if step.kind == StepKind.PERCEPTION.value and isinstance(reason, str) and reason.startswith("cascade:"):
                counts["probe" if reason == "cascade:probe" else "judge"] += 1
    return counts


def _judge_counters(detector: Detector) -> tuple[int, int, int] | None:
    detector = getattr(detector, "judge", None) or detector  # the cascade's judge stage
    if not all(hasattr(detector, a) for a in ("calls", "input_tokens", "output_tokens")):
        return None
    return int(detector.calls), int(detector.input_tokens), int(detector.output_tokens)  # type: ignore[attr-defined]


async def replay(
    chains: Sequence[LabelledChain],
    detector: Detector,
    *,
    judge: str | None = None,
    model: str | None = None,
    image_dir: str | Path | None = None,
    concurrency: int = 4,
    batch: int = 16,
    kinds: Kinds = "heuristic",
    progress: bool = True,
) -> tuple[list[LabelledChain], ReplayReport]:
    """Predictions for `chains` (same order) and the report: cost, latency, and F1 against their labels."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    from tqdm.auto import tqdm

    images = ImageResolver(image_dir)
    before = _judge_counters(detector)
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(chains), desc=f"replay {detector.name}", unit="chain", disable=not progress, leave=False)
    started = time.perf_counter()

    async def one(chain: LabelledChain) -> ChainReplay:
        async with gate:
            result = await replay_chain(
                chain, detector, judge=judge, model=model, images=images, batch=batch,
                kinds=kinds,
            )  # fmt: skip
        bar.update(1)
        return result

    try:
        results = await asyncio.gather(*(one(c) for c in chains))
    finally:
        bar.close()
    wall = time.perf_counter() - started
    after = _judge_counters(detector)
    latencies = [x for r in results for x in r.call_latencies]
    predictions = [r.prediction for r in results]
    counters = None if before is None or after is None else [a - b for a, b in zip(after, before, strict=True)]
    decided = _decided_by(predictions) if detector.reads_hidden_states and detector.uses_judge else None
    report = ReplayReport(
        detector=detector.name,
        judge=judge,
        chains=len(chains),
        steps=sum(len(c.steps) for c in chains),
        detector_calls=sum(r.calls for r in results),
        judge_calls=counters[0] if counters else None,
        judge_input_tokens=counters[1] if counters else None,
        judge_output_tokens=counters[2] if counters else None,
        generator_tokens=sum(r.generator_tokens for r in results),
        latency_mean_s=statistics.fmean(latencies) if latencies else None,
        latency_p50_s=_percentile(latencies, 0.5),
        latency_p95_s=_percentile(latencies, 0.95),
        detector_s_per_step=sum(latencies) / steps if (steps := sum(len(c.steps) for c in chains)) else None,
        wall_s=wall,
        errors=sum(len(r.errors) for r in results),
        images_missing=sum(1 for r in results if r.image_missing),
        upr_gold=upr(chains).upr,
        upr_predicted=upr(predictions).upr,
        f1=step_f1(chains, predictions).to_dict(),
        f1_by_position=f1_by_position(chains, predictions),
        decided_by=decided,
        probe_decided_share=decided["probe"] / sum(decided.values()) if decided and sum(decided.values()) else None,
    )
    return predictions, report
