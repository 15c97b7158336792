"""Detectors by name: each builds itself from the server's dependencies, the registry never names one."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from faithproxy.detectors import registry
from faithproxy.detectors.base import Detector
from faithproxy.detectors.cascade import CascadeDetector
from faithproxy.detectors.judge import JudgeDetector
from faithproxy.detectors.options import DetectorOption, probability
from faithproxy.detectors.probe import ProbeDetector
from faithproxy.detectors.prompt import SelfCheckDetector
from faithproxy.detectors.registry import (
    DETECTORS,
    DetectorDeps,
    Entry,
    build_detectors,
    decision_stages,
    declared_options,
    resolve,
)
from faithproxy.faithcore.context import CheckResult, RequestView
from faithproxy.faithcore.types import Step


class FakeProbe:
    """What ProbeDetector needs of a loaded probe at construction."""

    def check_compatible(self, **_: Any) -> None:
        return None


class FakeHidden:
    layers = (1, 2)


class ExtraDetector(Detector):
    """A detector added by registration alone; built only when the server has a default judge name."""

    name: ClassVar[str] = "extra"
    options: ClassVar[tuple[DetectorOption, ...]] = (
        DetectorOption("extra_level", "x-faithproxy-extra-level", probability, "a probability from 0 to 1"),
    )
    decision_stages: ClassVar[tuple[str, ...]] = ("first", "second")

    def __init__(self, judge: str) -> None:
        self.judge = judge

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> Detector | None:
        return cls(deps.default_judge) if deps.default_judge else None

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        return CheckResult(())


def test_registered_names_are_the_classes_names() -> None:
    for name in DETECTORS:
        assert resolve(name).name == name


def test_without_dependencies_only_the_self_sufficient_detectors_are_built() -> None:
    assert sorted(build_detectors(DetectorDeps())) == ["none", "prompt"]


def test_judges_build_the_judge_with_the_default_or_the_first() -> None:
    judges = {"a": object(), "b": object()}
    built = build_detectors(DetectorDeps(judges=judges))
    assert sorted(built) == ["judge", "none", "prompt"]
    judge = built["judge"]
    assert isinstance(judge, JudgeDetector) and judge.default == "a"
    assert build_detectors(DetectorDeps(judges=judges, default_judge="b"))["judge"].default == "b"  # type: ignore[attr-defined]


def test_probe_needs_both_a_probe_and_hidden_states() -> None:
    assert "probe" not in build_detectors(DetectorDeps(probe=FakeProbe()))
    assert "probe" not in build_detectors(DetectorDeps(hidden=FakeHidden()))
    built = build_detectors(DetectorDeps(probe=FakeProbe(), hidden=FakeHidden()))
    assert sorted(built) == ["none", "probe", "prompt"]  # no cascade without a judge


def test_cascade_is_made_of_the_built_probe_and_judge() -> None:
    decisions: list[tuple[str, int]] = []
    deps = DetectorDeps(
        judges={"a": object()},
        probe=FakeProbe(),
        hidden=FakeHidden(),
        cascade_low=0.2,
        cascade_high=0.7,
        on_cascade_decision=lambda stage, n: decisions.append((stage, n)),
    )
    built = build_detectors(deps)
    assert sorted(built) == ["cascade", "judge", "none", "probe", "prompt", "routed"]
    cascade = built["cascade"]
    assert isinstance(cascade, CascadeDetector)
    assert cascade.probe is built["probe"] and cascade.judge is built["judge"]
    assert (cascade.low, cascade.high, cascade.on_decision) == (0.2, 0.7, deps.on_cascade_decision)
    assert isinstance(built["probe"], ProbeDetector)


def test_a_new_detector_needs_only_an_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DETECTORS, "extra", Entry(f"{__name__}:ExtraDetector", "test only"))
    assert "extra" not in build_detectors(DetectorDeps())
    built = build_detectors(DetectorDeps(judges={"a": object()}, default_judge="a"))
    assert isinstance(built["extra"], ExtraDetector) and built["extra"].judge == "a"
    # its option and its metric labels reach the server through the registry, not through an import
    assert ExtraDetector.options[0] in declared_options()
    assert decision_stages() == ("probe", "judge", "first", "second")


def test_the_built_in_declarations() -> None:
    """The headers and stages the server serves today come from the detectors' classes."""
    assert {o.header: o.key for o in declared_options()} == {
        "x-faithproxy-judge-budget": "judge_budget_tokens",
        "x-faithproxy-flag-threshold": "flag_threshold",  # the judge's (issue 32)
        "x-faithproxy-probe-threshold": "probe_threshold",
        "x-faithproxy-cascade-low": "cascade_low",
        "x-faithproxy-cascade-high": "cascade_high",
        "x-faithproxy-cascade-rewrites": "cascade_rewrites",
        "x-faithproxy-consistency-threshold": "consistency_threshold",
        "x-faithproxy-routes": "routes",
    }
    assert decision_stages() == ("probe", "judge")


def test_the_prompt_detector_gets_the_generator_when_built() -> None:
    generator = object()
    built = build_detectors(DetectorDeps(generator=generator))
    assert isinstance(built["prompt"], SelfCheckDetector) and built["prompt"].generator is generator


def test_unknown_detectors_are_suggested() -> None:
    with pytest.raises(KeyError, match="unknown detector 'jduge'; did you mean 'judge'"):
        resolve("jduge")


def test_build_detectors_compares_no_names() -> None:
    tree = ast.parse(inspect.getsource(registry.build_detectors))
    compared = [
        node.value
        for cmp in ast.walk(tree)
        if isinstance(cmp, ast.Compare)
        for node in ast.walk(cmp)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert compared == []


# Header values the copied parsers are tried on: each parser must read them as its detector's does.
_SAMPLE_VALUES = (
    "0", "0.5", "1", " 0.25 ", "1.5", "-0", "nan", "", "x", "7", "10", "1000000000000", "1000000000001", "١",
    "judge", "Cascade", "probe", "count=judge,*=probe", "count=judge", "*=none", "a=judge;*=judge",
)  # fmt: skip


def _option_fields(option: DetectorOption) -> tuple[object, ...]:
    return tuple(getattr(option, f.name) for f in dataclasses.fields(option) if f.name != "parse")


def test_every_entry_carries_its_classs_declarations() -> None:
    """The copies the server reads without importing a detector (Entry.declares) are its class's own."""
    for name, entry in DETECTORS.items():
        cls = resolve(name)
        assert {attr for attr, _ in entry.declares} == set(registry.DECLARED), name
        assert entry.declared("decision_stages") == (True, cls.decision_stages), name
        assert entry.declared("uses_judge") == (True, cls.uses_judge), name
        _, copied = entry.declared("options")
        assert [_option_fields(o) for o in copied] == [_option_fields(o) for o in cls.options], name
        for mine, theirs in zip(copied, cls.options, strict=True):
            assert [mine.parse(v) for v in _SAMPLE_VALUES] == [theirs.parse(v) for v in _SAMPLE_VALUES], mine.header


def test_the_declarations_are_read_without_importing_a_detector() -> None:
    """What the server reads of the built-in detectors (metric labels, header table, judge use) loads no
    detector module: a fresh interpreter, so earlier tests' imports do not count."""
    script = (
        "import sys\n"
        "from faithproxy.detectors import registry\n"
        "registry.declared_options(); registry.decision_stages()\n"
        "[registry.uses_judge(name) for name in registry.DETECTORS]\n"
        "specific = {e.target.partition(':')[0] for e in registry.DETECTORS.values()}\n"
        "print(sorted(specific & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_a_copied_parser_imports_its_module_when_a_header_is_read() -> None:
    (routes,) = [o for o in declared_options() if o.key == "routes"]
    assert isinstance(routes.parse, registry.ImportedParser)
    assert routes.parse("count=judge,*=probe") == {"count": "judge", "*": "probe"}
    assert routes.parse("count=judge") is None  # no `*` route
