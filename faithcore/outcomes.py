"""What the correction machine reports of a regeneration try and of an upstream break: the outcomes of its
notes (faithcore/correction/actions.py) and the label values of their metrics. Apart from the machine's
package so that server/observe/metrics.py reads them without loading the machine (and its segmenter):
a server in off mode never does.
"""

from __future__ import annotations

import enum


class TryOutcome(enum.StrEnum):
    """How a regeneration try ended (the label values of faithproxy_regeneration_attempts_total)."""

    FIXED = "fixed"  # the candidate passed the check: it replaces the step
    STILL_UNFAITHFUL = "still_unfaithful"  # the candidate was flagged too
    UNPARSEABLE = "unparseable"  # the regenerator's reply held no candidate
    ERROR = "error"  # the regenerator failed
    INSISTED = "insisted"  # the model restated the flagged step: it is kept, no further try is spent


class ResumeOutcome(enum.StrEnum):
    """What became of an upstream break (the label values of faithproxy_upstream_resumes_total)."""

    RESUMED = "resumed"  # a new round continues the chain from where it stood
    EXHAUSTED = "exhausted"  # no attempt was left: the request fails
