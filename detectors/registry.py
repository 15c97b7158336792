"""Detectors by name: what `X-Faithproxy-Detector` may say and `faithproxy detectors` lists.

Entries are lazy "module:attr" strings (importing the judge pulls in two SDKs); unknown names get a
"did you mean". Detectors that need server resources are built by `build_detectors` from `DetectorDeps`.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any

from detectors.base import Detector


@dataclass(frozen=True)
class Entry:
    target: str  # "module:attr"
    description: str
    available: bool = True  # planned detectors are listed but refused until they exist


DETECTORS: dict[str, Entry] = {
    "judge": Entry("detectors.judge:JudgeDetector", "auxiliary VLM judge (Anthropic or OpenAI-compatible)"),
    "prompt": Entry("detectors.prompt:SelfCheckDetector", "self-assessment prompting of the generator"),
    "none": Entry("detectors.none:NoneDetector", "no check: every step passes unchecked"),
    "probe": Entry("detectors.probe:ProbeDetector", "linear probe on hidden states (not built yet)", False),
    "cascade": Entry("detectors.cascade:CascadeDetector", "probe, then judge when unsure (not built yet)", False),
}


@dataclass
class DetectorDeps:
    """What detectors may need from the server: judge backends by name, the default judge."""

    judges: dict[str, Any] = field(default_factory=dict)
    default_judge: str | None = None


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
        else:
            built[name] = cls()
    return built
