"""`routed`: each perception step goes to the detector its kind of claim is routed to.

Why: no single detector a team can run is good at every kind of claim. On development seed 997 the
learned judge flags counts at precision 0.67 and recall 1.0 but objects placed in a cell at 0.06 / 0.38,
while the generator's own signals (probe, consistency) reach about 0.45-0.48 there
(docs/detector-analysis.md). Routing sends each kind to the detector that reads it best.

Routes are `kind=detector` pairs, comma- or semicolon-separated, with `*` for every kind not named:
`count=judge,*=probe` (FAITHPROXY_ROUTED_ROUTES, per request X-Faithproxy-Routes). A step's kind comes
from the server's claim reader (FAITHPROXY_CONSISTENCY_CLAIMS, detectors/claim_readers.py `kind`); a
perception step the reader cannot read goes to `*`. Each route names a detector built on this server
other than `routed` itself and `none`.

Going through the batch in order, consecutive perception steps with the same route (and the reasoning
steps between them) are checked by that detector in one call, with the steps before them as accepted
context; reasoning steps before any such run pass. An unfaithful
verdict ends the batch (the steps after it are UNKNOWN and read again after the correction), as the judge
does. A rewrite's candidate goes to the route of its own kind, so a count is re-checked by whoever
checks counts. Verdicts keep their detector's reason, prefixed `routed:<detector>:`; usage and
hidden-state features are gathered from every call.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from faithproxy.detectors.base import Detector
from faithproxy.detectors.claim_readers import ClaimReader, claim_reader
from faithproxy.detectors.options import DetectorOption
from faithproxy.faithcore.context import CheckResult, RequestView, Usage
from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict

if TYPE_CHECKING:
    from faithproxy.detectors.base import DetectorDeps

ROUTES_OPTION = "routes"  # RequestView.options key
ANY_KIND = "*"
_NOT_ROUTABLE = ("routed", "none")
_PAIR = re.compile(r"^\s*([a-z_*][a-z0-9_]*|\*)\s*=\s*([a-z][a-z0-9_]*)\s*$")


def parse_routes(raw: str) -> dict[str, str] | None:
    """`kind=detector` pairs (comma or semicolon between them) as a dict; None for text that is not
    one, a kind named twice, or no `*` route (every step must have somewhere to go)."""
    routes: dict[str, str] = {}
    for pair in re.split(r"[,;]", raw.strip().lower()):
        match = _PAIR.match(pair)
        if match is None or match[1] in routes or match[2] in _NOT_ROUTABLE:
            return None
        routes[match[1]] = match[2]
    return routes if ANY_KIND in routes else None


class RoutedDetector(Detector):
    """Each claim kind to its own detector (see the module docstring)."""

    name: ClassVar[str] = "routed"
    description: ClassVar[str] = "each claim kind to the detector that reads it best (e.g. counts to the judge)"
    uses_judge: ClassVar[bool] = True  # the default routes send counts to the judge
    # The default routes reach the probe, which reads hidden states itself: the server then records no
    # features on the side (it would capture them twice). Steps routed elsewhere carry none in the trace.
    reads_hidden_states: ClassVar[bool] = True
    options: ClassVar[tuple[DetectorOption, ...]] = (
        DetectorOption(
            ROUTES_OPTION,
            "x-faithproxy-routes",
            parse_routes,
            "kind=detector pairs separated by commas, one of them *=detector",
            setting="routed_routes",
        ),
    )

    def __init__(self, detectors: Mapping[str, Detector], reader: ClaimReader, routes: Mapping[str, str]) -> None:
        self.detectors = dict(detectors)
        self.reader = reader
        self.routes = dict(routes)
        self._check_routes(self.routes)

    @classmethod
    def from_deps(cls, deps: DetectorDeps, built: Mapping[str, Detector]) -> RoutedDetector | None:
        """Made of the detectors built before it; None when its default routes name one that was not
        built (the name is then refused per request)."""
        routes = parse_routes(deps.routed_routes)
        if routes is None:
            raise ValueError(f"routed_routes {deps.routed_routes!r} is not kind=detector pairs with a * route")
        if any(name not in built for name in routes.values()):
            return None
        reader = claim_reader(deps.consistency.get("claims", "words"))
        return cls({k: v for k, v in built.items() if k not in _NOT_ROUTABLE}, reader, routes)

    def _check_routes(self, routes: Mapping[str, str]) -> None:
        missing = sorted({name for name in routes.values() if name not in self.detectors})
        if missing:
            raise PolicyError(
                f"routes name detectors this server has not built: {', '.join(missing)} "
                f"(built: {', '.join(sorted(self.detectors))})"
            )

    def routes_for(self, view: RequestView) -> dict[str, str]:
        return dict(view.options.get(ROUTES_OPTION) or self.routes)

    def validate_request(self, view: RequestView) -> None:
        routes = self.routes_for(view)
        self._check_routes(routes)
        for name in dict.fromkeys(routes.values()):
            self.detectors[name].validate_request(view)

    def route(self, step: Step, routes: Mapping[str, str]) -> str | None:
        """The detector that checks `step` (None: a reasoning step, which passes)."""
        if step.kind is not StepKind.PERCEPTION:
            return None
        kind = self.reader.kind(step.text)
        return routes.get(kind, routes[ANY_KIND]) if kind is not None else routes[ANY_KIND]

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        started = time.perf_counter()
        routes = self.routes_for(view)
        targets = [self.route(step, routes) for step in new_steps]
        verdicts: list[Verdict | None] = [None] * len(new_steps)
        features: list[Any | None] = [None] * len(new_steps)
        read_features = False
        usage = Usage()
        i = 0
        while i < len(new_steps):
            target = targets[i]
            if target is None:
                verdicts[i] = Verdict(Faithfulness.FAITHFUL, self.name, kind=new_steps[i].kind, reason="routed:pass")
                i += 1
                continue
            run = i + 1  # reasoning steps between two steps of the same route go with them: one call
            while run < len(new_steps) and targets[run] in (target, None):
                run += 1
            context = view.with_accepted([*view.accepted, *new_steps[:i]])
            result = await self.detectors[target].check(context, new_steps[i:run])
            usage.add(result.usage)
            elapsed = time.perf_counter() - started
            for j, verdict in enumerate(result.verdicts, start=i):
                verdicts[j] = dataclasses.replace(
                    verdict,
                    detector=self.name,
                    reason=f"routed:{target}:{verdict.reason or 'verdict'}",
                    latency_s=elapsed,
                )
            if result.features is not None:
                read_features = True
                features[i:run] = result.features
            if any(v.unfaithful for v in result.verdicts):
                break
            i = run
        done = [
            v if v is not None else Verdict(Faithfulness.UNKNOWN, self.name, reason="routed:not_reached")
            for v in verdicts
        ]
        return CheckResult(tuple(done), usage, tuple(features) if read_features else None)
