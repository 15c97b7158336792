"""`faithproxy bench calibrate`: a judge's flag threshold, chosen from a measured curve.

The judge is replayed over labelled chains (benchmarks/evaluation/replay.py) with no threshold, so every
flag it raises comes back with its confidence (P(UNFAITHFUL) of the flagged sentence, from the reply's
log-probabilities: detectors/judge_confidence.py). For each threshold the flags at or above it are the
ones the proxy would act on (a flag whose confidence is unknown is always acted on: thresholds do not
apply to it), and against the file's gold labels (perception steps with `faithful`) they give precision,
recall and F1 of the unfaithful class.

Cost per threshold. Detection costs the same at every threshold: the replay asks again about the steps
after each flag, as the proxy does after an unsure one, so its judge tokens are measured once. A flag
acted on costs up to `tries_per_flag` rewrites, each checked by one more judge call; the curve prints
those tries (all, and those caused by false flags) and the judge tokens they add at the replay's mean
tokens per call. These are upper bounds (a rewrite that passes stops the tries early), the same bound for
every threshold, so the curve compares thresholds fairly.

A threshold is picked for a target: the most recall at `--at-least` precision, the most precision at
`--at-least` recall, or the best F1; the judge's config line (its `JUDGES` entry with
`flag_threshold`, keys left out) is printed for the operator to paste, and `--png` plots the curve.
Choose thresholds on validation chains, never on the chains a result is reported on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from faithproxy.benchmarks.evaluation.labelled import LabelledChain
from faithproxy.clients.judge_base import JudgeBackend, JudgeConfig

Target = Literal["precision", "recall", "f1"]
DEFAULT_THRESHOLDS = tuple(round(0.05 * k, 2) for k in range(20))  # 0.0 (act on every flag) to 0.95


@dataclass(frozen=True)
class Flag:
    """A perception step with a gold label: whether it is unfaithful, whether the judge flagged it, and
    the judge's confidence in that flag (None: unknown)."""

    unfaithful: bool
    flagged: bool
    confidence: float | None = None

    def acted_on(self, threshold: float) -> bool:
        return self.flagged and (self.confidence is None or self.confidence >= threshold)


@dataclass(frozen=True)
class Point:
    """The curve at one threshold."""

    threshold: float
    flags: int
    true_flags: int
    false_flags: int
    missed: int
    precision: float | None
    recall: float | None
    f1: float | None
    rewrite_tries: int  # at most: every flag acted on spending all its tries
    false_flag_tries: int
    judge_tokens: int  # detection (measured) + the rechecks of those tries (at the mean tokens per call)


def gold_flags(gold: Sequence[LabelledChain], predictions: Sequence[LabelledChain]) -> list[Flag]:
    """One Flag per gold-labelled perception step, paired with the replay's prediction of it."""
    out = []
    for chain, predicted in zip(gold, predictions, strict=True):
        for step, guess in zip(chain.steps, predicted.steps, strict=True):
            if not step.is_perception or step.faithful is None:
                continue
            flagged = guess.extra.get("verdict") == "unfaithful"
            confidence = guess.extra.get("confidence") if flagged else None
            out.append(Flag(step.faithful is False, flagged, confidence))
    return out


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def point(
    flags: Sequence[Flag], threshold: float, *, detect_tokens: int, tokens_per_call: float, tries_per_flag: int
) -> Point:
    acted = [f for f in flags if f.acted_on(threshold)]
    tp = sum(1 for f in acted if f.unfaithful)
    fp = len(acted) - tp
    fn = sum(1 for f in flags if f.unfaithful) - tp
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else (0.0 if tp + fp + fn else None)
    tries = len(acted) * tries_per_flag
    return Point(
        threshold, len(acted), tp, fp, fn, precision, recall, f1, tries, fp * tries_per_flag,
        detect_tokens + round(tries * tokens_per_call),
    )  # fmt: skip


def curve(
    flags: Sequence[Flag],
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    *,
    detect_tokens: int = 0,
    tokens_per_call: float = 0.0,
    tries_per_flag: int = 3,
) -> list[Point]:
    """The curve over `thresholds` (sorted)."""
    return [
        point(flags, t, detect_tokens=detect_tokens, tokens_per_call=tokens_per_call, tries_per_flag=tries_per_flag)
        for t in sorted(set(thresholds))
    ]


def pick(points: Sequence[Point], target: Target, at_least: float | None = None) -> Point | None:
    """The threshold for `target`: the most recall at `at_least` precision, the most precision at
    `at_least` recall, or the best F1; among equals the lowest threshold (the same flags on these chains,
    and the least recall lost on others). None when no threshold reaches `at_least`."""
    if target == "f1":
        scored = [p for p in points if p.f1 is not None]
        return max(scored, key=lambda p: (p.f1, -p.threshold)) if scored else None
    floor = 0.0 if at_least is None else at_least
    other: Target = "recall" if target == "precision" else "precision"
    ok = [p for p in points if (getattr(p, target) or 0.0) >= floor]
    return max(ok, key=lambda p: (getattr(p, other) or 0.0, -p.threshold)) if ok else None


def judge_line(config: JudgeConfig, threshold: float) -> str:
    """The judge's `JUDGES` entry with `flag_threshold` set; its key is left out."""
    data = config.model_dump(mode="json", exclude={"api_key"}, exclude_none=True) | {"flag_threshold": threshold}
    return json.dumps(data, ensure_ascii=False)


def plot(points: Sequence[Point], path: Path, title: str, chosen: Point | None = None) -> None:
    """Precision, recall and F1 against the threshold, with the rewrite tries on a second axis."""
    from faithproxy.benchmarks.evaluation.report import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = [p.threshold for p in points]
    for name in ("precision", "recall", "f1"):
        ax.plot(xs, [getattr(p, name) for p in points], marker=".", label=name)
    ax.set_xlabel("flag threshold (P(UNFAITHFUL) of the flag)")
    ax.set_ylim(0, 1.02)
    if chosen is not None:
        ax.axvline(chosen.threshold, color="grey", linestyle="--", linewidth=1)
    tries = ax.twinx()
    tries.plot(xs, [p.rewrite_tries for p in points], color="black", linestyle=":", label="rewrite tries (at most)")
    tries.set_ylabel("rewrite tries")
    lines = ax.get_legend_handles_labels()
    more = tries.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="lower left")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def replay_flags(
    chains: Sequence[LabelledChain], judges: Mapping[str, JudgeBackend], judge: str, **replay_options: Any
) -> tuple[list[Flag], Any]:
    """Replays the judge over `chains` with no threshold; (flags, the replay's report)."""
    from faithproxy.benchmarks.evaluation.replay import make_detector, replay

    detector = make_detector("judge", judges=judges, default_judge=judge)
    try:
        predictions, report = await replay(chains, detector, judge=judge, **replay_options)
    finally:
        await detector.aclose()
    return gold_flags(chains, predictions), report


class Calibrate:
    """The `bench calibrate` command."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from faithproxy.benchmarks.evaluation.cli import _add_judges

        parser.add_argument("--judge", required=True, help="the judge to calibrate (a name in --judges)")
        parser.add_argument("--chains", required=True, help="labelled chains (validation chains, not the test set)")
        parser.add_argument("--target", choices=["precision", "recall", "f1"], default="f1", help="what to pick for")
        parser.add_argument("--at-least", type=float, help="precision or recall the pick must reach")
        parser.add_argument("--tries-per-flag", type=int, default=3, help="rewrite tries a flag costs (default 3)")
        parser.add_argument("--thresholds", help="comma-separated thresholds (default 0, 0.05, ..., 0.95)")
        parser.add_argument("--batch", type=int, default=16, help="most steps per judge call (default 16)")
        parser.add_argument("--kinds", choices=["heuristic", "gold"], default="gold", help="step kinds (default gold)")
        parser.add_argument("--png", help="write the curve as a PNG here")
        parser.add_argument("--out", help="write the curve and the pick as JSON here")
        _add_judges(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from faithproxy.benchmarks.evaluation.cli import CommandError, _fmt, _judge_configs, _print, _read
        from faithproxy.clients.judges import build_judges

        configs = {c.name: c for c in _judge_configs(args.judges)}
        if args.judge not in configs:
            raise CommandError(f"--judge {args.judge!r} is not configured (have: {sorted(configs)})")
        config = configs[args.judge]
        judges = build_judges([config.model_copy(update={"flag_threshold": None})])  # every flag comes back
        chains = _read(args.chains)[: args.limit]
        thresholds = [float(t) for t in args.thresholds.split(",")] if args.thresholds else DEFAULT_THRESHOLDS
        flags, report = asyncio.run(
            replay_flags(
                chains,
                judges,
                args.judge,
                image_dir=args.images,
                concurrency=args.concurrency,
                batch=args.batch,
                kinds=args.kinds,
                progress=not args.no_progress,
            )  # fmt: skip
        )
        detect_tokens = (report.judge_input_tokens or 0) + (report.judge_output_tokens or 0)
        per_call = detect_tokens / report.judge_calls if report.judge_calls else 0.0
        points = curve(flags, thresholds, detect_tokens=detect_tokens, tokens_per_call=per_call,
                       tries_per_flag=args.tries_per_flag)  # fmt: skip
        chosen = pick(points, args.target, args.at_least)
        if args.png:
            plot(points, Path(args.png), f"{args.judge} on {Path(args.chains).name}", chosen)
        unknown = sum(1 for f in flags if f.flagged and f.confidence is None)
        data = {
            "judge": args.judge,
            "chains": len(chains),
            "labelled_perception_steps": len(flags),
            "flags_without_confidence": unknown,
            "judge_calls": report.judge_calls,
            "errors": report.errors,
            "curve": [asdict(p) for p in points],
            "target": args.target,
            "at_least": args.at_least,
            "chosen": asdict(chosen) if chosen else None,
            "judge_config": judge_line(config, chosen.threshold) if chosen else None,
        }
        if args.out:
            Path(args.out).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        lines = [f"{args.judge}: {len(chains)} chains, {len(flags)} labelled perception steps, "
                 f"{report.judge_calls} judge calls, {report.errors} errors, {unknown} flags without confidence",
                 "threshold  flags  precision  recall  F1      tries  false-flag tries  judge tokens"]  # fmt: skip
        lines += [
            f"{p.threshold:9.2f}  {p.flags:5d}  {_fmt(p.precision, 3):>9}  {_fmt(p.recall, 3):>6}  "
            f"{_fmt(p.f1, 3):>6}  {p.rewrite_tries:5d}  {p.false_flag_tries:16d}  {p.judge_tokens:12d}"
            for p in points
        ]
        if chosen is None:
            lines.append(f"no threshold reaches {args.target} >= {args.at_least}")
        else:
            lines += [f"chosen for {args.target}: {chosen.threshold:.2f}", judge_line(config, chosen.threshold)]
        _print(args, data, lines)
        return 0 if chosen is not None else 1
