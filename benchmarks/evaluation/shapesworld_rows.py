"""The rows of `faithproxy bench shapesworld`, and what each row is scored on beyond UPR and accuracy.

A row is a detector (`X-Faithproxy-Detector`) and, for a detector that calls a judge, the judge it calls
(`X-Faithproxy-Judge`): `judge:pixels` (the pixel oracle behind the Anthropic API), `judge:learned` (the
learned ShapesWorld judge on a second vLLM, through the OpenAI-compatible backend), `prompt`, `probe`,
`cascade` (probe, then the learned judge). A bare `judge` is the pixel judge (the name the bench always
had); a bare `cascade` asks the learned judge, since a cascade in front of an oracle saves nothing.
A row may end in `@T`, a flag threshold sent as `X-Faithproxy-Flag-Threshold` (e.g. `judge:learned@0.4`):
the judge's flags whose confidence is under T are delivered `unsure` and not rewritten. Only a detector
that calls a judge takes one, and `consistency` (the generator's own samples, no judge), whose `@T` is
sent as `X-Faithproxy-Consistency-Threshold`: it flags a step when at least that share of the samples
does not support it. A threshold is chosen on validation-seed chains (`--seed`, `--start`), never
on the held-out ones the row is reported on.

Every figure here is by ground truth (`shapesworld.claims` on the scene's true objects), read from the
proxy's traces (server/observe/summary.py `trace_steps`): a step's `original_text` is its first draft, `detected`
the detector's first verdict on it, `attempts` the regeneration tries it took.

- False flags: first drafts the detector flagged that are not false by ground truth. Each costs
  regeneration tries, and a rewrite changes the chain from that step on.
- Answers against vanilla: the proxy decodes greedily like vanilla vLLM, so a chain is vanilla's until
  its first rewritten step. A changed answer is put down to that step: a false flag or a true one;
  a chain whose flagged steps were all kept can still end early (`answer_changes`).
- Step types and error kinds: which sentences a detector misses (false negatives, by what the sentence
  got wrong) and which it flags wrongly (false positives, by the form of the sentence).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_sentence, step_type
from faithproxy.benchmarks.shapesworld.dataset import Item
from faithproxy.benchmarks.shapesworld.language import Claim, CountClaim, RelationClaim
from faithproxy.benchmarks.shapesworld.model.scoring import ReplyScore, score_reply
from faithproxy.benchmarks.shapesworld.world import Ref, WorldObject, count_matching

PIXELS = "pixels"  # the pixel judge server (an oracle: it reads the scene exactly)
LEARNED = "learned"  # the learned ShapesWorld judge, served by vLLM
JUDGES = (PIXELS, LEARNED)
# What a bare judge-calling detector name asks (see the module docstring).
_BARE_JUDGE = {"judge": PIXELS, "cascade": LEARNED}
ALL_ROWS = ("judge:pixels", "judge:learned", "prompt", "probe", "cascade")


@dataclass(frozen=True)
class Row:
    name: str  # as given on the command line; the key of the row in the results
    detector: str
    judge: str | None  # PIXELS | LEARNED for a detector that calls a judge, else None
    reads_hidden_states: bool = False
    flag_threshold: float | None = None  # `@T`: the judge's flags under T are delivered unsure
    rewrites: str | None = None  # `+rewrites=judge|cascade`: who checks a rewrite under the cascade
    regenerator: str | None = None  # `+regenerator=NAME`: the proxy's FAITHPROXY_REGENERATOR for this row
    routes: str | None = None  # `+routes=kind=detector;...`: a routed row's X-Faithproxy-Routes

    def headers(self) -> dict[str, str]:
        headers = {"x-faithproxy-mode": "correct", "x-faithproxy-detector": self.detector}
        if self.judge is not None:
            headers["x-faithproxy-judge"] = self.judge
        if self.flag_threshold is not None:
            # a judge's flags under T are unsure; the consistency detector flags at T and above
            name = "consistency-threshold" if self.detector == "consistency" else "flag-threshold"
            headers[f"x-faithproxy-{name}"] = repr(self.flag_threshold)
        if self.rewrites is not None:
            headers["x-faithproxy-cascade-rewrites"] = self.rewrites
        if self.routes is not None:
            headers["x-faithproxy-routes"] = self.routes
        return headers


def _threshold(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"row {name!r}: the flag threshold after @ must be a number") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"row {name!r}: the flag threshold must be from 0 to 1")
    return value


def parse_row(text: str) -> Row:
    """`DETECTOR`, `DETECTOR:JUDGE`, either with `@T`, a cascade row also with `+rewrites=judge|cascade`
    (the server's FAITHPROXY_CASCADE_REWRITES when absent), a routed row with `+routes=kind=detector;...`
    (`;` between routes: the row list is comma-separated), any row ending in `+regenerator=NAME`;
    ValueError for an unknown detector or judge,
    a judge or a threshold given to a detector that calls none, or a threshold outside 0..1."""
    from faithproxy.detectors.cascade import REWRITE_CHECKERS
    from faithproxy.detectors.registry import DETECTORS
    from faithproxy.detectors.routed import parse_routes
    from faithproxy.regenerators.registry import REGENERATORS

    name = text.strip()
    rest, plus, regenerator_text = name.partition("+regenerator=")
    regenerator = regenerator_text if plus else None
    if plus and regenerator not in REGENERATORS:
        raise ValueError(f"row {name!r}: +regenerator= takes one of {', '.join(REGENERATORS)}")
    rest, plus, routes_text = rest.partition("+routes=")
    routes = routes_text if plus else None
    if plus and parse_routes(routes_text) is None:
        raise ValueError(f"row {name!r}: +routes= takes kind=detector pairs separated by ';', one of them *=detector")
    head, plus, rewrites_text = rest.partition("+rewrites=")
    rewrites = rewrites_text if plus else None
    if plus and rewrites not in REWRITE_CHECKERS:
        raise ValueError(f"row {name!r}: +rewrites= takes one of {', '.join(REWRITE_CHECKERS)}")
    spec, at, threshold_text = head.partition("@")
    threshold = _threshold(name, threshold_text) if at else None
    detector, _, judge = spec.partition(":")
    try:
        cls = DETECTORS.resolve(detector)
    except KeyError as exc:
        raise ValueError(str(exc).strip("'\"")) from exc
    if rewrites is not None and cls.name != "cascade":
        raise ValueError(f"row {name!r}: +rewrites= is for cascade rows")
    if routes is not None and cls.name != "routed":
        raise ValueError(f"row {name!r}: +routes= is for routed rows")
    if not cls.uses_judge:
        if judge or (at and cls.name != "consistency"):
            raise ValueError(f"row {name!r}: the {detector} detector calls no judge")
        return Row(name, detector, None, cls.reads_hidden_states, threshold, regenerator=regenerator)
    judge = judge or _BARE_JUDGE.get(detector, LEARNED)
    if judge not in JUDGES:
        raise ValueError(f"row {name!r}: unknown judge {judge!r} (known: {', '.join(JUDGES)})")
    return Row(name, detector, judge, cls.reads_hidden_states, threshold, rewrites, regenerator, routes)


# ------------------------------------------------------------------ UPR, accuracy, P/R/F1


def ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b else 0.0


def chain_scores(items: Sequence[Item], replies: Sequence[str]) -> dict[str, Any]:
    scores = [score_reply(item, reply) for item, reply in zip(items, replies, strict=True)]
    steps = sum(s.perception_steps for s in scores)
    errors = sum(s.perception_errors for s in scores)
    by_type: dict[str, list[ReplyScore]] = {}
    for s in scores:
        by_type.setdefault(s.qtype, []).append(s)
    return {
        "chains": len(scores),
        "perception_steps": steps,
        "unfaithful_steps": errors,
        "upr": ratio(errors, steps),
        "chains_with_error": ratio(sum(s.perception_errors > 0 for s in scores), len(scores)),
        "accuracy": ratio(sum(s.correct for s in scores), len(scores)),
        "accuracy_by_type": {q: ratio(sum(s.correct for s in g), len(g)) for q, g in sorted(by_type.items())},
        "well_formed": ratio(sum(s.well_formed for s in scores), len(scores)),
        # accuracy = right option text AND its letter: the two parts apart
        "option_text_correct": ratio(sum(s.option_text_correct for s in scores), len(scores)),
        "letter_matches_text": ratio(sum(s.letter_matches_text for s in scores), len(scores)),
    }


def draft_scores(items: Sequence[Item], traces: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The detector on the generator's first drafts inside the proxy, against ground truth, and what
    regeneration made of the steps it flagged."""
    tp = fp = fn = tn = 0
    unsure = unsure_false = 0  # flags under the row's threshold: delivered unsure, not acted on
    outcomes: Counter[str] = Counter()
    fixes_true = fixes = 0
    drafts = draft_errors = 0
    for item, trace in zip(items, traces, strict=True):
        for step in trace["steps"]:
            draft = step["original_text"] if step["original_text"] is not None else step["text"]
            truth = check_sentence(draft.strip(), item.scene.objects)
            flagged = step["detected"] == "unfaithful"
            if truth.kind == PERCEPTION:
                drafts += 1
                wrong = truth.faithful is False
                draft_errors += wrong
                unsure += step["detected"] == "unsure"
                unsure_false += step["detected"] == "unsure" and wrong
                tp += wrong and flagged
                fp += flagged and not wrong
                fn += wrong and not flagged
                tn += not wrong and not flagged
            if flagged:
                if step["residual"]:
                    outcomes["residual"] += 1
                elif step["original_text"] is not None:
                    outcomes[f"fixed_at_attempt_{step['attempts']}"] += 1
                    fixes += 1
                    fixes_true += check_sentence(step["text"].strip(), item.scene.objects).faithful is not False
                else:
                    outcomes["other"] += 1
    precision, recall = ratio(tp, tp + fp), ratio(tp, tp + fn)
    f1 = round(2 * precision * recall / (precision + recall), 4) if precision + recall else 0.0
    return {
        "draft_perception_steps": drafts,
        "draft_unfaithful_steps": draft_errors,
        "upr_first_draft": ratio(draft_errors, drafts),
        "upr_detected": ratio(tp + fp, drafts),
        "detector_vs_ground_truth": {
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "tn": tn,
            "precision": precision,
            "recall": recall,
            "f1": f1,
        },  # fmt: skip
        "unsure_steps": {"steps": unsure, "false_by_ground_truth": unsure_false},
        "regeneration_outcomes": dict(sorted(outcomes.items())),
        "accepted_fixes_true_by_ground_truth": ratio(fixes_true, fixes),
    }


# ------------------------------------------------------------------------------------ first drafts


@dataclass(frozen=True)
class Draft:
    """One step of a corrected chain as the generator first wrote it, and what the proxy did with it."""

    text: str
    claim: Claim | None
    perception: bool  # by ground truth: a sentence of the world language making a claim
    false: bool  # by ground truth
    flagged: bool  # the detector's first verdict was UNFAITHFUL
    rewritten: bool  # the returned chain holds another sentence here
    attempts: int
    unchecked_reason: str | None


def drafts(item: Item, trace: Mapping[str, Any]) -> list[Draft]:
    out = []
    for step in trace["steps"]:
        text = step["original_text"] if step["original_text"] is not None else step["text"]
        check = check_sentence(text.strip(), item.scene.objects)
        out.append(
            Draft(
                text=text,
                claim=check.claim,
                perception=check.kind == PERCEPTION,
                false=check.faithful is False,
                flagged=step["detected"] == "unfaithful",
                rewritten=step["original_text"] is not None,
                attempts=int(step.get("attempts") or 0),
                unchecked_reason=step.get("unchecked_reason"),
            )
        )
    return out


# ------------------------------------------------------------------ false flags, answers vs vanilla


def _answer_move(before: str | None, after: str | None, gold: str) -> str:
    if before == after:
        return "same"
    if before == gold:
        return "right_to_wrong"
    if after == gold:
        return "wrong_to_right"
    return "wrong_to_wrong"


def answer_changes(
    items: Sequence[Item],
    traces: Sequence[Mapping[str, Any]],
    vanilla_replies: Sequence[str],
    corrected_replies: Sequence[str],
) -> dict[str, Any]:
    """False flags and what they cost, and every changed answer against vanilla by its cause.

    A chain's cause is its first rewritten step: `false_flag` when that draft was true by ground truth,
    `true_flag` when it was false. A chain with no step rewritten is `untouched` when the detector
    flagged nothing: one upstream round, so the proxy decoding greedily must return vanilla's text
    (`untouched_identical_to_vanilla` checks it). It is `kept` when every flagged step was kept after
    K failed tries: the text is the model's own, but each flag dropped the round and decoding resumed
    from the accepted text, and the dropped read-ahead counts against the client's max_tokens (as
    reasoning tokens do at OpenAI), so a slow judge's flags can end such a chain early, by length.
    `kept_identical_to_vanilla` is what share of those still came out as vanilla's: a figure, not an
    invariant.
    """
    false_steps = false_tries = false_rewritten = 0
    by_cause: dict[str, Counter[str]] = {c: Counter() for c in ("false_flag", "true_flag", "kept", "untouched")}
    same_as_vanilla: Counter[str] = Counter()
    for item, trace, vanilla, corrected in zip(items, traces, vanilla_replies, corrected_replies, strict=True):
        steps = drafts(item, trace)
        for d in steps:
            if d.flagged and not d.false:
                false_steps += 1
                false_tries += d.attempts
                false_rewritten += d.rewritten
        first = next((d for d in steps if d.rewritten), None)
        if first is not None:
            cause = "true_flag" if first.false else "false_flag"
        else:
            cause = "kept" if any(d.flagged for d in steps) else "untouched"
        gold = item.question.gold_letter
        move = _answer_move(score_reply(item, vanilla).answer, score_reply(item, corrected).answer, gold)
        by_cause[cause]["chains"] += 1
        by_cause[cause][move] += 1
        same_as_vanilla[cause] += corrected.strip() == vanilla.strip()
    causes = {
        cause: {
            "chains": c["chains"],
            "answers_changed": c["chains"] - c["same"],
            "right_to_wrong": c["right_to_wrong"],
            "wrong_to_right": c["wrong_to_right"],
        }
        for cause, c in by_cause.items()
    }
    changed = {k: sum(c[k] for c in causes.values()) for k in ("answers_changed", "right_to_wrong", "wrong_to_right")}
    return {
        "false_flags": {
            "steps": false_steps,
            "regeneration_tries": false_tries,
            "steps_rewritten": false_rewritten,
            "chains_first_rewritten_at_a_false_flag": causes["false_flag"]["chains"],
            "answers_changed": causes["false_flag"]["answers_changed"],
            "right_to_wrong": causes["false_flag"]["right_to_wrong"],
            "wrong_to_right": causes["false_flag"]["wrong_to_right"],
        },
        "answers_vs_vanilla": changed | {"by_cause": causes},
        "untouched_identical_to_vanilla": _share(same_as_vanilla["untouched"], by_cause["untouched"]["chains"]),
        "kept_identical_to_vanilla": _share(same_as_vanilla["kept"], by_cause["kept"]["chains"]),
    }


def _share(n: int, of: int) -> float | None:
    return round(n / of, 4) if of else None


# ------------------------------------------------------------------- where a detector errs, by kind


def error_kind(claim: Claim, objects: Sequence[WorldObject]) -> str:
    """What a false sentence got wrong: count, existence (nothing like it / nothing in that cell),
    position, or the attributes (shape, colour, size; joined with '+') of the object it names."""
    if isinstance(claim, CountClaim):
        return "existence" if claim.n == 0 else "count"
    if isinstance(claim, RelationClaim):
        named = [any(ref.matches(o) for o in objects) for ref in (claim.subject, claim.anchor)]
        return "position" if all(named) else "existence"
    ref = claim.ref
    if ref.row is not None and ref.col is not None:
        there = [o for o in objects if o.cell == (ref.row, ref.col)]
        if not there:
            return "existence"
        wrong = [a for a in ("shape", "colour", "size") if getattr(ref, a) not in (None, getattr(there[0], a))]
        return "+".join(wrong) or "other"
    if count_matching(Ref(ref.shape, ref.colour, ref.size), objects):
        return "position"
    for attribute in ("shape", "colour", "size"):  # one attribute off an object that is there
        loose = Ref(**{a: getattr(ref, a) for a in ("shape", "colour", "size", "row", "col") if a != attribute})
        if getattr(ref, attribute) is not None and count_matching(loose, objects):
            return attribute
    return "existence"


def errors_by_kind(items: Sequence[Item], traces: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The detector's confusion on first-draft perception steps per step type, and its misses and
    catches by error kind."""
    by_type: dict[str, Counter[str]] = {}
    missed: Counter[str] = Counter()
    caught: Counter[str] = Counter()
    for item, trace in zip(items, traces, strict=True):
        for d in drafts(item, trace):
            if not d.perception or d.claim is None:
                continue
            cell = "tp" if d.false and d.flagged else "fn" if d.false else "fp" if d.flagged else "tn"
            by_type.setdefault(step_type(d.claim), Counter())[cell] += 1
            if d.false:
                (caught if d.flagged else missed)[error_kind(d.claim, item.scene.objects)] += 1
    return {
        "by_step_type": {t: {k: c[k] for k in ("tp", "fp", "fn", "tn")} for t, c in sorted(by_type.items())},
        "missed_by_error_kind": dict(missed.most_common()),
        "caught_by_error_kind": dict(caught.most_common()),
    }


def unchecked_steps(items: Sequence[Item], traces: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """First-draft perception steps the detector gave no verdict on, by the proxy's reason (a judge
    reply it could not parse, a judge that failed, ...): they pass unflagged."""
    reasons: Counter[str] = Counter()
    for item, trace in zip(items, traces, strict=True):
        reasons.update(d.unchecked_reason for d in drafts(item, trace) if d.perception and d.unchecked_reason)
    return dict(reasons.most_common())


# ------------------------------------------------------------------------------------ the judge's bill

BILL_KEYS = ("calls", "input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens", "descriptions")


def judge_bill(summaries: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The requests' judge bills (the `judge` block of each faithfulness summary) added up.
    `input_tokens` are the fresh prompt tokens; `cached_input_tokens` those the judge read from its cache."""
    return {k: sum(int((s.get("judge") or {}).get(k, 0)) for s in summaries) for k in BILL_KEYS}


def cascade_decisions(metrics_text: str) -> dict[str, int]:
    """faithproxy_cascade_decisions_total{stage} from a proxy's /metrics page (perception steps decided
    by the probe and by the judge)."""
    decided: dict[str, int] = {}
    for line in metrics_text.splitlines():
        if line.startswith("faithproxy_cascade_decisions_total{"):
            labels, _, value = line.rpartition(" ")
            stage = labels.split('stage="', 1)[1].split('"', 1)[0]
            decided[stage] = int(float(value))
    return decided


# ------------------------------------------------------------------------------------ a row's figures


def row_replies(raw: Mapping[str, Any], name: str) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """A row of `run_all`'s output as (contents, traces, faithfulness summaries), one per chain."""
    replies = raw[name]["replies"]
    contents = [content for content, _, _ in replies]
    traces = [raw["traces"][request_id] for _, request_id, _ in replies]
    return contents, traces, [summary for _, _, summary in replies]


def score_rows(items: Sequence[Item], raw: dict[str, Any], detectors: Sequence[str]) -> dict[str, Any]:
    """Each row's figures from `run_all`'s output, against ground truth and against the vanilla chains."""
    vanilla = chain_scores(items, raw["vanilla_replies"])
    rows: dict[str, Any] = {}
    for name in detectors:
        row = parse_row(name)
        contents, traces, summaries = row_replies(raw, name)
        corrected = chain_scores(items, contents)
        entry: dict[str, Any] = {
            "detector": row.detector,
            "judge": row.judge,
            "flag_threshold": row.flag_threshold,
            **({"regenerator": row.regenerator} if row.regenerator is not None else {}),
            **({"cascade_rewrites": row.rewrites} if row.rewrites is not None else {}),
            "corrected": corrected,
            **draft_scores(items, traces),
            "proxy_summary_upr_detected": ratio(
                sum(s.get("unfaithful_detected", 0) for s in summaries),
                sum(s.get("perception_steps", 0) for s in summaries),
            ),
            "regenerations": sum(s.get("regenerations", 0) for s in summaries),
            **answer_changes(items, traces, raw["vanilla_replies"], contents),
            "judge_bill": judge_bill(summaries),
            "unchecked_steps": unchecked_steps(items, traces),
            "errors_by_kind": errors_by_kind(items, traces),
            "wall_s": round(raw[name]["wall_s"], 1),
            "prefix_caches_reset": raw[name].get("prefix_caches_reset"),
            "upr_reduction_vs_vanilla": round(1 - corrected["upr"] / vanilla["upr"], 4) if vanilla["upr"] else 0.0,
        }
        if "generator_requests" in raw[name]:  # rows behind the router: chains/regenerations vs captures
            entry["generator_requests"] = raw[name]["generator_requests"]
        if row.detector == "cascade":  # the proxy's counter exists (at 0) under every detector
            entry["cascade_decisions"] = raw[name].get("cascade_decisions") or {}
        rows[name] = entry
    return rows
