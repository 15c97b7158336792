"""Detectors by name: what `X-Faithproxy-Detector` may say and `faithproxy detectors` lists.

Entries are lazy (importing the judge pulls in its prompt and backends); unknown names get a "did you
mean". `build_detectors` builds every registered detector whose dependencies are present, each by its
own `Detector.from_deps`, in registration order: a detector made of others (the cascade) comes after
them. `declared_options`, `decision_stages` and `uses_judge` gather what the registered detectors declare
on their classes (their per-request options, their metric labels, whether they call a judge), so that the
server asks the registry and never imports a detector's module. Each built-in entry carries a copy of
those declarations (`Entry.declares`): the server reads them on every request and when its metrics are
made, and reading them loads no detector (the consistency detector's segmenter brings nltk). An entry
without the copy (a detector registered by a test) is imported to read them. tests/detectors/
test_registry.py keeps every copy equal to its class's.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from faithproxy.detectors.base import Detector, DetectorDeps
from faithproxy.detectors.options import DetectorOption, probability, whole_number
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
    "uses_judge",
]

# What the server reads of a detector without building it (Detector's class attributes of these names).
DECLARED = ("options", "decision_stages", "uses_judge")


@dataclass(frozen=True)
class ImportedParser:
    """An option's parser named "package.module:function", imported at its first call (a request sent
    the option's header): the copy of a parser that lives in its detector's module."""

    target: str

    def __call__(self, raw: str) -> Any:
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)(raw)


def _declares(
    options: tuple[DetectorOption, ...] = (), decision_stages: tuple[str, ...] = (), *, uses_judge: bool = False
) -> tuple[tuple[str, Any], ...]:
    return (("options", options), ("decision_stages", decision_stages), ("uses_judge", uses_judge))


_PROBABILITY = "a probability from 0 to 1"

DETECTORS: Registry[type[Detector]] = Registry(
    "detector",
    Detector,
    {
        "judge": Entry(
            "faithproxy.detectors.judge:JudgeDetector",
            "auxiliary VLM judge (Anthropic or OpenAI-compatible)",
            _declares(
                (
                    DetectorOption(
                        "judge_budget_tokens",
                        "x-faithproxy-judge-budget",
                        whole_number(10**12),
                        "a whole number of judge tokens (0 or more; 0 checks nothing with the judge)",
                        setting="judge_budget_tokens",
                        setting_is_default=True,
                        ceiling="asks for {value} judge tokens, more than this server allows a request ({limit})",
                    ),
                    DetectorOption(
                        "flag_threshold",
                        "x-faithproxy-flag-threshold",
                        probability,
                        f"{_PROBABILITY} (a flag the judge is less sure of is delivered unsure, not rewritten)",
                    ),
                ),
                uses_judge=True,
            ),
        ),
        "prompt": Entry(
            "faithproxy.detectors.prompt:SelfCheckDetector", "self-assessment prompting of the generator", _declares()
        ),
        "none": Entry("faithproxy.detectors.none:NoneDetector", "no check: every step passes unchecked", _declares()),
        "probe": Entry(
            "faithproxy.detectors.probe:ProbeDetector",
            "classifier over the generator's hidden states (vLLM route 1)",
            _declares((DetectorOption("probe_threshold", "x-faithproxy-probe-threshold", probability, _PROBABILITY),)),
        ),
        "cascade": Entry(
            "faithproxy.detectors.cascade:CascadeDetector",
            "probe when confident, judge otherwise",
            _declares(
                (
                    DetectorOption(
                        "cascade_low",
                        "x-faithproxy-cascade-low",
                        probability,
                        _PROBABILITY,
                        setting="cascade_low",
                        not_above="cascade_high",
                    ),
                    DetectorOption(
                        "cascade_high", "x-faithproxy-cascade-high", probability, _PROBABILITY, setting="cascade_high"
                    ),
                    DetectorOption(
                        "cascade_rewrites",
                        "x-faithproxy-cascade-rewrites",
                        ImportedParser("faithproxy.detectors.cascade:rewrite_checker"),
                        "judge or cascade",
                        setting="cascade_rewrites",
                    ),
                ),
                ("probe", "judge"),
                uses_judge=True,
            ),
        ),
        "consistency": Entry(
            "faithproxy.detectors.consistency:ConsistencyDetector",
            "generator self-consistency: k samples from the same prefix vote on each step",
            _declares(
                (
                    DetectorOption(
                        "consistency_threshold",
                        "x-faithproxy-consistency-threshold",
                        probability,
                        _PROBABILITY,
                        setting="consistency_threshold",
                    ),
                )
            ),
        ),
        # after every detector it may route to (it is built from them)
        "routed": Entry(
            "faithproxy.detectors.routed:RoutedDetector",
            "each claim kind to the detector that reads it best (e.g. counts to the judge)",
            _declares(
                (
                    DetectorOption(
                        "routes",
                        "x-faithproxy-routes",
                        ImportedParser("faithproxy.detectors.routed:parse_routes"),
                        "kind=detector pairs separated by commas, one of them *=detector",
                        setting="routed_routes",
                    ),
                ),
                uses_judge=True,
            ),
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
            for option in DETECTORS.declared(name, "options"):
                seen.setdefault(option.header, option)
        cached = _DECLARED[entries] = tuple(seen.values())
    return cached


_DECLARED: dict[tuple[tuple[str, Entry], ...], tuple[DetectorOption, ...]] = {}


def decision_stages() -> tuple[str, ...]:
    """Every stage a registered detector may report a decision for (DetectorDeps.on_cascade_decision):
    the label set of faithproxy_cascade_decisions_total, read when the metrics module is imported."""
    stages: dict[str, None] = {}
    for name in DETECTORS:
        stages.update(dict.fromkeys(DETECTORS.declared(name, "decision_stages")))
    return tuple(stages)


def uses_judge(name: str) -> bool:
    """Whether the detector registered as `name` calls a judge (UnknownName for a name it lacks)."""
    return bool(DETECTORS.declared(name, "uses_judge"))
