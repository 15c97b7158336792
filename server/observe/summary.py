"""The `faithfulness` summary sent to the client, and the steps of each request's trace record
(server/observe/traces.py).

The summary's `judge` block is the request's judge bill (faithcore.context.JudgeState.summary): calls,
input_tokens (fresh prompt tokens), cached_input_tokens (read from the judge's prompt cache),
cache_creation_tokens (written to it), output_tokens, descriptions (image descriptions the judge wrote;
at most one per request) and budget_steps (perception steps passed unchecked because the request's
judge budget was spent). All zero for a detector that calls no judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from faithproxy.faithcore.types import Faithfulness, Step, StepKind, Verdict


def step_annotation(step: Step) -> dict[str, Any]:
    verdict = step.verdict
    first = step.first_verdict
    return {
        "index": step.index,
        "kind": step.kind.value,
        "verdict": verdict.faithfulness.value if verdict else Faithfulness.UNKNOWN.value,
        "detected": first.faithfulness.value if first else Faithfulness.UNKNOWN.value,
        "attempts": step.attempts,
        "regenerated": step.original_text is not None,
        "residual": step.residual,
        **({"confidence": _confidence(first)} if first is not None and first.faithfulness in _FLAGS else {}),
        **({"original_text": step.original_text} if step.original_text is not None else {}),
        **({"unchecked_reason": step.unchecked_reason} if step.unchecked_reason else {}),
    }


_FLAGS = (Faithfulness.UNFAITHFUL, Faithfulness.UNSURE)  # the verdicts a step annotation shows a confidence for


def _confidence(verdict: Verdict) -> float | None:
    """A flag's confidence as the client sees it; None (null) when the detector could not say how sure
    it was (a judge without log-probabilities, a detector without a score)."""
    return round(verdict.confidence, 4) if verdict.confidence is not None else None


def upr_counts(steps: list[Step]) -> dict[str, Any]:
    perception = [s for s in steps if s.kind is StepKind.PERCEPTION]
    detected = sum(1 for s in perception if s.first_verdict is not None and s.first_verdict.unfaithful)
    residual = sum(1 for s in perception if s.residual)
    n = len(perception)
    return {
        "perception_steps": n,
        "unfaithful_detected": detected,
        "residual": residual,
        "upr_detected": detected / n if n else 0.0,
        "upr_residual": residual / n if n else 0.0,
    }


def summarize(
    steps: list[Step],
    *,
    mode: str,
    detector: str,
    regenerations: int,
    verification_s: float,
    rounds: int,
    judge: dict[str, int] | None = None,
    resumes: int = 0,
) -> dict[str, Any]:
    """`judge`: the request's judge bill (JudgeState.summary()); omitted when not given. `resumes`: rounds
    started after an upstream break (docs/replicas.md), counted in `rounds` too."""
    return {
        "mode": mode,
        "detector": detector,
        "steps": [step_annotation(s) for s in steps],
        **upr_counts(steps),
        "regenerations": regenerations,
        "fixed": sum(1 for s in steps if s.original_text is not None),
        "rounds": rounds,
        "resumes": resumes,
        "verification_s": round(verification_s, 6),
        **({"judge": judge} if judge is not None else {}),
    }


def trace_steps(steps: Sequence[Step]) -> list[dict[str, Any]]:
    out = []
    for s in steps:
        out.append(
            {
                "index": s.index,
                "channel": s.channel.value,
                "kind": s.kind.value,
                "text": s.text,
                "original_text": s.original_text,
                "verdict": s.verdict.faithfulness.value if s.verdict else None,
                "detected": s.first_verdict.faithfulness.value if s.first_verdict else None,
                "score": s.first_verdict.score if s.first_verdict else None,
                "confidence": s.first_verdict.confidence if s.first_verdict else None,
                # why the detector flagged (or passed) the original text: the judge's reason, for a reader
                "reason": s.first_verdict.reason if s.first_verdict else None,
                "attempts": s.attempts,
                "rejected": list(s.rejected),
                "residual": s.residual,
                "residual_reason": s.residual_reason,
                "unchecked_reason": s.unchecked_reason,
                "detector_latency_s": s.first_verdict.latency_s if s.first_verdict else None,
            }
        )
        if s.features is not None:  # hidden-state features of the original text (probe training)
            out[-1]["features"] = s.features.to_json()
    return out
