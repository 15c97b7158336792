"""Detectors by name: what `X-Faithproxy-Detector` may say and `faithproxy detectors` lists.

Entries are lazy "module:attr" strings (importing the judge pulls in two SDKs); unknown names get a
"did you mean". Detectors that need server resources are built by `build_detectors` from `DetectorDeps`.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faithproxy.detectors.base import Detector


@dataclass(frozen=True)
class Entry:
    target: str  # "module:attr"
    description: str
    available: bool = True  # planned detectors are listed but refused until they exist


DETECTORS: dict[str, Entry] = {
    "judge": Entry("faithproxy.detectors.judge:JudgeDetector", "auxiliary VLM judge (Anthropic or OpenAI-compatible)"),
    "prompt": Entry("faithproxy.detectors.prompt:SelfCheckDetector", "self-assessment prompting of the generator"),
    "none": Entry("faithproxy.detectors.none:NoneDetector", "no check: every step passes unchecked"),
    "probe": Entry(
        "faithproxy.detectors.probe:ProbeDetector", "classifier over the generator's hidden states (vLLM route 1)"
    ),
    "cascade": Entry("faithproxy.detectors.cascade:CascadeDetector", "probe when confident, judge otherwise"),
}


@dataclass
class DetectorDeps:
    """What detectors may need from the server: judge backends by name, the default judge; for the probe
    and the cascade a loaded probe and a hidden-states client (both, or neither is built)."""

    judges: dict[str, Any] = field(default_factory=dict)
    default_judge: str | None = None
    probe: Any = None  # detectors.probe.Probe
    hidden: Any = None  # clients.hidden_states.HiddenStatesClient
    cascade_low: float = 0.1
    cascade_high: float = 0.9
    on_cascade_decision: Callable[[str, int], None] | None = None


def resolve(name: str) -> type[Detector]:
    entry = DETECTORS.get(name)
    if entry is None:
        hint = difflib.get_close_matches(name, list(DETECTORS), n=1)
        raise KeyError(f"unknown detector {name!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
    module, _, attr = entry.target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Detector)):
        raise TypeError(f"{entry.target} is not a Detector")
    return cls


def build_detectors(deps: DetectorDeps) -> dict[str, Detector]:
    """One instance of every available detector whose dependencies are present."""
    built: dict[str, Detector] = {}
    for name, entry in DETECTORS.items():
        if not entry.available:
            continue
        cls = resolve(name)
        if name == "judge":
            if not deps.judges:
                continue  # no judge configured on this server: the name is refused per request
            default = deps.default_judge or next(iter(deps.judges))
            built[name] = cls(deps.judges, default)  # type: ignore[call-arg]
        elif name in ("probe", "cascade"):
            continue  # built below, from the probe file and the hidden-states client
        else:
            built[name] = cls()
    if deps.probe is not None and deps.hidden is not None:
        probe = resolve("probe")(deps.probe, deps.hidden)  # type: ignore[call-arg]
        built["probe"] = probe
        if "judge" in built:
            built["cascade"] = resolve("cascade")(  # type: ignore[call-arg]
                probe,
                built["judge"],
                low=deps.cascade_low,
                high=deps.cascade_high,
                on_decision=deps.on_cascade_decision,
            )
    return built
