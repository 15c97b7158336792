"""Detectors by name: what `X-Faithproxy-Detector` may say and `faithproxy detectors` lists.

Entries are lazy (importing the judge pulls in its prompt and backends); unknown names get a "did you
mean". `build_detectors` builds every registered detector whose dependencies are present, each by its
own `Detector.from_deps`, in registration order: a detector made of others (the cascade) comes after
them. `declared_options` and `decision_stages` gather what the registered detectors declare on their
classes (their per-request options, their metric labels), so that the server asks the registry and never
imports a detector's module.
"""

from __future__ import annotations

from faithproxy.detectors.base import Detector, DetectorDeps
from faithproxy.detectors.options import DetectorOption
from faithproxy.faithcore.registry import Entry, Registry

__all__ = [
    "DETECTORS",
    "DetectorDeps",
    "DetectorOption",
    "Entry",
    "build_detectors",
    "decision_stages",
    "declared_options",
    "resolve",
]

DETECTORS: Registry[type[Detector]] = Registry(
    "detector",
    Detector,
    {
        "judge": Entry(
            "faithproxy.detectors.judge:JudgeDetector", "auxiliary VLM judge (Anthropic or OpenAI-compatible)"
        ),
        "prompt": Entry("faithproxy.detectors.prompt:SelfCheckDetector", "self-assessment prompting of the generator"),
        "none": Entry("faithproxy.detectors.none:NoneDetector", "no check: every step passes unchecked"),
        "probe": Entry(
            "faithproxy.detectors.probe:ProbeDetector", "classifier over the generator's hidden states (vLLM route 1)"
        ),
        "cascade": Entry("faithproxy.detectors.cascade:CascadeDetector", "probe when confident, judge otherwise"),
        "consistency": Entry(
            "faithproxy.detectors.consistency:ConsistencyDetector",
            "generator self-consistency: k samples from the same prefix vote on each step",
        ),
        # after every detector it may route to (it is built from them)
        "routed": Entry(
            "faithproxy.detectors.routed:RoutedDetector",
            "each claim kind to the detector that reads it best (e.g. counts to the judge)",
        ),
    },
)


def resolve(name: str) -> type[Detector]:
    """The Detector class registered as `name` (UnknownName, a KeyError, with a suggestion otherwise)."""
    return DETECTORS.resolve(name)


def build_detectors(deps: DetectorDeps) -> dict[str, Detector]:
    """One instance of every registered detector whose dependencies are present."""
    built: dict[str, Detector] = {}
    for name in DETECTORS:
        detector = DETECTORS.resolve(name).from_deps(deps, built)
        if detector is not None:
            built[name] = detector
    return built


def declared_options() -> tuple[DetectorOption, ...]:
    """Every registered detector's per-request options, in registry order, each header once (two
    detectors may share an option). Read on every request (the header table): computed once per state
    of the registry, which a registration changes."""
    entries = tuple(DETECTORS.items())  # Entry is frozen: the tuple is a key for what is registered
    cached = _DECLARED.get(entries)
    if cached is None:
        seen: dict[str, DetectorOption] = {}
        for name in DETECTORS:
            for option in DETECTORS.resolve(name).options:
                seen.setdefault(option.header, option)
        cached = _DECLARED[entries] = tuple(seen.values())
    return cached


_DECLARED: dict[tuple[tuple[str, Entry], ...], tuple[DetectorOption, ...]] = {}


def decision_stages() -> tuple[str, ...]:
    """Every stage a registered detector may report a decision for (DetectorDeps.on_cascade_decision)."""
    stages: dict[str, None] = {}
    for name in DETECTORS:
        stages.update(dict.fromkeys(DETECTORS.resolve(name).decision_stages))
    return tuple(stages)
