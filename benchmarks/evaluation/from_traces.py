"""Proxy trace records (server/observe/traces.py, schema version 1) → labelled chains, and back, losslessly.

A trace record becomes one labelled chain:

    trace                         labelled chain
    id                            id
    prompt                        question ("" when the request never reached a session; then the
                                  record also keeps "prompt": null)
    images[0]                     image (the sha256; all of `images` is kept as well)
    answer                        answer
    –                             gold_answer (null: a trace has no gold answer)
    steps[i].text, .kind          steps[i].text, .kind
    steps[i].verdict              steps[i].faithful (perception steps only: true / false / null)
    steps[i].score                steps[i].detected_score (as written), and steps[i].score when it
                                  scores the step's text (see the views)
    everything else               kept under its own name, on the record or on the step

Two views of a corrected chain:

- "delivered" (default, the lossless conversion): each step is the text the client received, labelled
  by the verdict of that text. UPR over it is the residual UPR (steps left unfaithful). A rewritten
  step has no `score` (the detector's P(unfaithful) was of the ORIGINAL text).
- "original": each step is the model's own first text (`original_text` when it was rewritten),
  labelled by the verdict that text got (`detected`). UPR over it is the detected UPR, and it is the
  view to replay detectors on. The delivered text is kept as "delivered_text".

`trace_of(chain)` inverts either view: `trace_of(chain_of_trace(t, view=v)) == t` for every record.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from faithproxy.benchmarks.evaluation.labelled import (
    KINDS,
    PERCEPTION,
    LabelledChain,
    LabelledFormatError,
    LabelledStep,
)

View = Literal["delivered", "original"]
VIEWS: tuple[View, ...] = ("delivered", "original")
SUPPORTED_TRACE_VERSIONS = (1,)
_VIEW_KEY = "trace_view"  # on the record: which view built it (absent: delivered)


class TraceFormatError(LabelledFormatError):
    """A trace line that is not a proxy trace record of a supported version."""


def _faithful(verdict: Any) -> bool | None:
    return {"faithful": True, "unfaithful": False}.get(verdict) if isinstance(verdict, str) else None


def _step_of(trace_step: dict[str, Any], view: View, where: str) -> LabelledStep:
    if not isinstance(trace_step, dict) or not isinstance(trace_step.get("text"), str):
        raise TraceFormatError(f"{where}: a trace step must be an object with a 'text'")
    extra = {k: v for k, v in trace_step.items() if k not in ("text", "kind", "score")}
    if "score" in trace_step:
        extra["detected_score"] = trace_step["score"]  # kept as written, whatever the view uses
    rewritten = trace_step.get("original_text") is not None
    if view == "original":
        text = trace_step["original_text"] if rewritten else trace_step["text"]
        extra["delivered_text"] = trace_step["text"]
        label = trace_step.get("detected")
    else:
        text = trace_step["text"]
        label = trace_step.get("verdict")
    score = trace_step.get("score")
    if view == "delivered" and rewritten:
        score = None  # the score belongs to the original text, not to the delivered one
    kind = trace_step.get("kind")
    if kind not in KINDS:
        extra["trace_kind"] = kind  # a kind this format does not know: kept, not guessed
        kind = None
    return LabelledStep(
        text=text,
        kind=kind,
        faithful=_faithful(label) if kind == PERCEPTION else None,
        score=float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None,
        extra=extra,
    )


def chain_of_trace(record: dict[str, Any], *, view: View = "delivered", where: str = "trace") -> LabelledChain:
    """One labelled chain from one trace record (see the module docstring for the mapping)."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, not {view!r}")
    if not isinstance(record, dict):
        raise TraceFormatError(f"{where}: a trace record must be a JSON object")
    version = record.get("version")
    if version not in SUPPORTED_TRACE_VERSIONS:
        raise TraceFormatError(f"{where}: trace schema version {version!r} is not supported "
                               f"(this faithproxy reads {SUPPORTED_TRACE_VERSIONS})")  # fmt: skip
    if not isinstance(record.get("id"), str) or not record["id"]:
        raise TraceFormatError(f"{where}: a trace record needs a string 'id'")
    steps = record.get("steps") or []
    if not isinstance(steps, list):
        raise TraceFormatError(f"{where}: 'steps' must be a list")
    images = record.get("images") or []
    extra = {k: v for k, v in record.items() if k not in ("id", "prompt", "steps", "answer")}
    if record.get("prompt") is None:
        extra["prompt"] = None
    if view != "delivered":
        extra[_VIEW_KEY] = view
    answer = record.get("answer")
    return LabelledChain(
        id=record["id"],
        question=record.get("prompt") or "",
        steps=[_step_of(s, view, f"{where}, step {i}") for i, s in enumerate(steps)],
        image=images[0] if images and isinstance(images[0], str) else None,
        answer=answer if isinstance(answer, str) else None,
        gold_answer=None,
        extra=extra,
    )


def _trace_step_of(step: LabelledStep, view: View) -> dict[str, Any]:
    extra = dict(step.extra)
    out: dict[str, Any] = {"text": extra.pop("delivered_text", step.text) if view == "original" else step.text}
    out["kind"] = extra.pop("trace_kind") if "trace_kind" in extra else step.kind
    if "detected_score" in extra:
        out["score"] = extra.pop("detected_score")
    out.update(extra)
    return out


def trace_of(chain: LabelledChain) -> dict[str, Any]:
    """The trace record a chain was converted from (equal as a JSON value; key order aside)."""
    extra = dict(chain.extra)
    view: View = extra.pop(_VIEW_KEY, "delivered")
    if "version" not in extra:
        raise TraceFormatError(f"chain {chain.id!r} was not converted from a proxy trace")
    prompt = extra.pop("prompt") if "prompt" in extra else chain.question
    record: dict[str, Any] = {"id": chain.id, "prompt": prompt, "answer": chain.answer}
    record["steps"] = [_trace_step_of(s, view) for s in chain.steps]
    record.update(extra)
    return record


def iter_trace_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for every non-blank line of a trace file."""
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8")
    except FileNotFoundError as exc:
        raise TraceFormatError(f"{path}: no such file") from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(f"{where}: not valid JSON ({exc.msg})") from exc


def chains_from_traces(
    paths: Iterable[str | Path],
    *,
    view: View = "delivered",
    skip_empty: bool = False,
    skip_errors: bool = False,
    modes: Iterable[str] | None = None,
) -> list[LabelledChain]:
    """Every trace record of `paths` as a labelled chain, in file order; a repeated id is an error.

    `skip_empty` drops records without steps (off-mode requests, requests that failed before the
    first step); `skip_errors` drops records with an error; `modes` keeps only those modes.
    """
    wanted = set(modes) if modes is not None else None
    seen: dict[str, str] = {}
    out = []
    for path in paths:
        for where, record in iter_trace_records(path):
            chain = chain_of_trace(record, view=view, where=where)
            if chain.id in seen:
                raise TraceFormatError(f"{where}: id {chain.id!r} also at {seen[chain.id]}")
            seen[chain.id] = where
            if skip_empty and not chain.steps:
                continue
            if skip_errors and record.get("error"):
                continue
            if wanted is not None and record.get("mode") not in wanted:
                continue
            out.append(chain)
    return out


def is_trace_file(path: str | Path) -> bool:
    """Whether the first record of a JSONL file is a proxy trace (it has a schema version and a prompt)."""
    for _, record in iter_trace_records(path):
        return isinstance(record, dict) and "version" in record and "prompt" in record
    return False


def read_any(path: str | Path, *, view: View = "delivered") -> list[LabelledChain]:
    """Labelled chains from a labelled-chain file, or converted from a proxy trace file."""
    from faithproxy.benchmarks.evaluation.labelled import read_chains

    return chains_from_traces([path], view=view) if is_trace_file(path) else read_chains(path)
