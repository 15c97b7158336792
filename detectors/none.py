"""The null detector: checks nothing, calls nothing.

Every step gets UNKNOWN, so the session counts it as unchecked (reason "detector_none") and the
residual UPR stays honest: a chain nobody checked is not a faithful chain.
"""

from __future__ import annotations

from typing import ClassVar

from faithproxy.detectors.base import Detector
from faithproxy.faithcore.context import CheckResult, RequestView
from faithproxy.faithcore.types import Faithfulness, Step, Verdict


class NoneDetector(Detector):
    """Returns UNKNOWN for every step without any call."""

    name: ClassVar[str] = "none"
    description: ClassVar[str] = "no detection: every step is passed unchecked"
    gives_verdicts: ClassVar[bool] = False

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        return CheckResult(tuple(Verdict(Faithfulness.UNKNOWN, self.name, reason="detector_none") for _ in new_steps))
