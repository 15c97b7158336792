"""`faithproxy bench ...`: labelled chains, metrics, offline replay, the evaluation judge, reports, runs.

    faithproxy bench from-traces TRACES... --out FILE [--view delivered|original]
    faithproxy bench upr FILE [--json]
    faithproxy bench f1 --gold FILE --pred FILE [--json]
    faithproxy bench icc --a FILE --b FILE [--json]
    faithproxy bench replay --traces FILE --detector NAME [--judge NAME] [--probe FILE] [--out FILE] [--json]
    faithproxy bench judge-upr FILE --judge NAME [--out FILE] [--json]
    faithproxy bench report --out DIR [--pair NAME VANILLA CORRECTED] [--swap NAME=FILE] ...
    faithproxy bench option-curve FILE --target URL --model M --out FILE
    faithproxy bench run ...            (benchmarks/evaluation/run.py)
    faithproxy bench validate --dataset NAME --data-dir DIR
    faithproxy bench score --dataset NAME --data-dir DIR --predictions FILE   (release_commands.py)

Wherever a command reads chains, FILE may be a labelled-chain file or a proxy trace file (converted on
the fly, `--view` choosing which text of a rewritten step counts). Judges for `replay` and `judge-upr`
are configured as the server configures them: `--judges` takes the JSON list of FAITHPROXY_JUDGES (or a
path to a file holding it) and defaults to that environment variable.

Subcommands are listed in COMMANDS: name → (target, help). A target is "module" or "module:attr" naming
an object with `add_arguments(parser)` and `main(args) -> int`; it is imported only when its command
runs, so adding a command is one line here and one module.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COMMANDS: dict[str, tuple[str, str]] = {
    "from-traces": (
        "faithproxy.benchmarks.evaluation.cli:FromTraces",
        "convert proxy traces to labelled chains (lossless)",
    ),
    "upr": ("faithproxy.benchmarks.evaluation.cli:Upr", "unfaithful perception rate of a labelled file"),
    "f1": (
        "faithproxy.benchmarks.evaluation.cli:F1",
        "precision, recall, F1 (and AUROC) of predictions against gold labels",
    ),
    "icc": ("faithproxy.benchmarks.evaluation.cli:Icc", "ICC(3,1) between two raters on per-chain counts"),
    "replay": (
        "faithproxy.benchmarks.evaluation.cli:Replay",
        "re-run a detector over recorded chains, offline, and score it",
    ),
    "calibrate": ("faithproxy.benchmarks.evaluation.calibrate:Calibrate", "a judge's flag threshold from a curve"),
    "insist": (
        "faithproxy.benchmarks.evaluation.insist_bench",
        "how often early stop when the model insists is right (ShapesWorld ground truth)",
    ),
    "judge-upr": (
        "faithproxy.benchmarks.evaluation.cli:JudgeUpr",
        "label whole chains with the evaluation judge (Algorithm 1)",
    ),
    "report": (
        "faithproxy.benchmarks.evaluation.cli:Report",
        "Markdown tables and PNG plots (Tables 11, 4, 12; option curve)",
    ),
    "option-curve": (
        "faithproxy.benchmarks.evaluation.cli:OptionCurve",
        "P(each MCQ option) after each step, from vLLM logprobs",
    ),
    "run": (
        "faithproxy.benchmarks.evaluation.run",
        "run a benchmark through faithproxy or straight to vLLM, and score it",
    ),
    "shapesworld": (
        "faithproxy.benchmarks.evaluation.shapesworld_bench",
        "ShapesWorld scenes (development seeds 997, 999): vanilla vs faithproxy per detector",
    ),
    "heldout": (
        "faithproxy.benchmarks.evaluation.heldout",
        "held-out ShapesWorld runs: freeze every option in a committed file, then evaluate the seed once",
    ),
    "validate": (
        "faithproxy.benchmarks.evaluation.release_commands:Validate",
        "read a benchmark release as published; print records per split and every problem (JSON)",
    ),
    "score": (
        "faithproxy.benchmarks.evaluation.release_commands:Score",
        "score a predictions file (official format or ours) with the benchmark's official rules (JSON)",
    ),
}


class CommandError(Exception):
    """A command that cannot run as asked; printed without a traceback, exit status 2."""


def _print(args: argparse.Namespace, data: dict[str, Any], lines: Sequence[str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, ensure_ascii=False))
    else:
        print("\n".join(lines))


def _fmt(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _add_view(parser: argparse.ArgumentParser, default: str = "delivered") -> None:
    parser.add_argument("--view", choices=["delivered", "original"], default=default,
                        help=f"for trace files: the delivered text of a rewritten step or the model's original "
                             f"(default {default})")  # fmt: skip


def _read(path: str, view: str = "delivered") -> list[Any]:
    from faithproxy.benchmarks.evaluation.from_traces import read_any

    return read_any(path, view=view)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ commands


class FromTraces:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("traces", nargs="+", help="trace files written by the proxy (FAITHPROXY_TRACE_PATH)")
        parser.add_argument("--out", required=True, help="labelled-chain file to write")
        _add_view(parser)
        parser.add_argument("--mode", action="append", help="keep only these modes (correct, detect, off)")
        parser.add_argument("--skip-empty", action="store_true", help="drop records without steps")
        parser.add_argument("--skip-errors", action="store_true", help="drop records that ended in an error")
        parser.add_argument("--json", action="store_true")

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from faithproxy.benchmarks.evaluation.from_traces import chains_from_traces
        from faithproxy.benchmarks.evaluation.labelled import write_chains

        chains = chains_from_traces(args.traces, view=args.view, skip_empty=args.skip_empty,
                                    skip_errors=args.skip_errors, modes=args.mode)  # fmt: skip
        written = write_chains(args.out, chains)
        steps = sum(len(c.steps) for c in chains)
        _print(args, {"chains": written, "steps": steps, "out": args.out, "view": args.view},
               [f"wrote {written} chains ({steps} steps, {args.view} view) to {args.out}"])  # fmt: skip
        return 0


class Upr:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", help="labelled-chain file (or proxy trace file)")
        _add_view(parser)
        parser.add_argument("--json", action="store_true")

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from faithproxy.benchmarks.evaluation.metrics import upr

        result = upr(_read(args.file, args.view))
        shown = "–" if result.upr is None else f"{100 * result.upr:.2f}%"
        _print(args, result.to_dict(), [
            f"UPR {shown} = {result.unfaithful_steps} unfaithful / {result.perception_steps} perception steps",
            f"chains {result.chains}, steps {result.steps}, perception steps without a label "
            f"{result.unlabelled_perception_steps}, chains with an unfaithful step {result.chains_with_unfaithful}",
        ])  # fmt: skip
        return 0


class F1:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--gold", required=True, help="labelled chains with the reference labels")
        parser.add_argument("--pred", required=True, help="labelled chains with a detector's labels (and scores)")
        _add_view(parser, "original")
        parser.add_argument("--no-text-check", action="store_true", help="match steps by index even if texts differ")
        parser.add_argument("--json", action="store_true")

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from faithproxy.benchmarks.evaluation.metrics import f1_by_position, step_f1

        gold, pred = _read(args.gold, args.view), _read(args.pred, args.view)
        result = step_f1(gold, pred, check_text=not args.no_text_check)
        by_position = f1_by_position(gold, pred, check_text=not args.no_text_check)
        u, f = result.unfaithful, result.faithful
        _print(args, result.to_dict() | {"by_position": by_position}, [
            f"unfaithful: precision {_fmt(u.precision)}  recall {_fmt(u.recall)}  F1 {_fmt(u.f1)}  "
            f"(tp {u.tp}, fp {u.fp}, fn {u.fn}, support {u.support})",
            f"faithful:   precision {_fmt(f.precision)}  recall {_fmt(f.recall)}  F1 {_fmt(f.f1)}  "
            f"(tp {f.tp}, fp {f.fp}, fn {f.fn}, support {f.support})",
            f"steps {result.steps} in {result.chains} chains, accuracy {_fmt(result.accuracy)}, abstained "
            f"{result.abstained}, AUROC {_fmt(result.auroc)} over {result.scored_steps} scored steps",
            *(f"steps {name}: unfaithful F1 {_fmt(b['f1'])}, AUROC {_fmt(b['auroc'])} ({b['steps']} steps)"
              for name, b in by_position.items()),
        ])  # fmt: skip
        return 0


class Icc:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--a", required=True, help="labelled chains of rater A")
        parser.add_argument("--b", required=True, help="labelled chains of rater B (same chain ids)")
        parser.add_argument("--rater", action="append", default=[], metavar="FILE",
                            help="a further rater (repeatable): ICC(3,1) over all of them")  # fmt: skip
        _add_view(parser)
        parser.add_argument("--json", action="store_true")

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from faithproxy.benchmarks.evaluation.metrics import icc_between

        files = [args.a, args.b, *args.rater]
        result = icc_between(*(_read(path, args.view) for path in files))
        names = "/".join("AB"[i] if i < 2 else str(i + 1) for i in range(len(files)))
        _print(args, result.to_dict(), [
            f"ICC(3,1) perception steps per chain: {_fmt(result.icc_perception)} "
            f"({names}: {'/'.join(map(str, result.perception_steps_by_rater))} steps)",
            f"ICC(3,1) unfaithful steps per chain: {_fmt(result.icc_unfaithful)} "
            f"({names}: {'/'.join(map(str, result.unfaithful_steps_by_rater))} steps)",
            f"chains {result.chains}, raters {result.raters}",
        ])  # fmt: skip
        return 0


def _judge_configs(value: str | None) -> list[Any]:
    from pydantic import ValidationError

    from faithproxy.clients.judges import JudgeConfig

    text = value if value is not None else os.environ.get("FAITHPROXY_JUDGES", "[]")
    if not text.lstrip().startswith(("[", "{")):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"--judges: cannot read {value!r} ({exc.strerror})") from exc
    try:
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
        return [JudgeConfig.model_validate(item) for item in items]
    except (ValueError, ValidationError) as exc:
        raise CommandError(f"--judges: not a valid judge list: {exc}") from exc


def _add_judges(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--judges", help="JSON list of judge configs, or a file with it (default: $FAITHPROXY_JUDGES)")
    _add_batch_options(parser)


def _add_batch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, help="only the first N chains")
    parser.add_argument("--images", help="directory with the chains' images (found by path or by sha256)")
    parser.add_argument("--concurrency", type=int, default=4, help="chains checked at the same time (default 4)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true")


class Replay:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--traces", required=True, help="proxy trace file or labelled-chain file")
        parser.add_argument("--detector", required=True, help="a name from `faithproxy detectors`")
        parser.add_argument("--judge", help="judge name for the judge detector (default: the first configured)")
        parser.add_argument("--out", help="write the predictions here (labelled format, with scores)")
        parser.add_argument("--batch", type=int, default=16, help="most steps per detector call (default 16)")
        kinds_help = "type steps with the proxy's keyword typer (default) or take the file's kinds"
        parser.add_argument("--kinds", choices=["heuristic", "gold"], default="heuristic", help=kinds_help)
        parser.add_argument("--generator", help="vLLM base URL, for detectors that ask the generator (prompt)")
        parser.add_argument("--model", help="model name for generator calls (default: the trace's model)")
        parser.add_argument("--probe", help="probe file for --detector probe or cascade (features: the steps' own)")
        parser.add_argument("--cascade-low", type=float, default=0.1, help="cascade: the probe decides below (0.1)")
        parser.add_argument("--cascade-high", type=float, default=0.9, help="cascade: and above (0.9)")
        _add_view(parser, "original")
        _add_judges(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from faithproxy.benchmarks.evaluation.labelled import write_chains
        from faithproxy.benchmarks.evaluation.replay import make_detector, probe_replay_deps, replay
        from faithproxy.clients.judges import build_judges
        from faithproxy.detectors.base import Detector
        from faithproxy.detectors.probe import Probe, ProbeFileError
        from faithproxy.detectors.registry import DETECTORS

        chains = _read(args.traces, args.view)[: args.limit]
        # judges only for a detector that uses one (an unknown name is refused by make_detector)
        known = args.detector in DETECTORS
        uses_judge = known and DETECTORS.resolve(args.detector).uses_judge
        reads_hidden = known and DETECTORS.resolve(args.detector).reads_hidden_states
        deps: dict[str, Any] = {"cascade_low": args.cascade_low, "cascade_high": args.cascade_high}
        if args.probe and known and not reads_hidden:
            raise CommandError(f"--probe is for the detectors that read hidden states, not {args.detector!r}")
        if reads_hidden and not args.probe:
            raise CommandError(f"detector {args.detector!r} needs --probe FILE (from `faithproxy probe train`)")
        if args.probe:
            try:
                deps |= probe_replay_deps(chains, Probe.load(args.probe), args.model)
            except ProbeFileError as exc:
                raise CommandError(f"--probe: {exc}") from exc
        configs = _judge_configs(args.judges) if uses_judge else []
        judges = build_judges(configs)
        default = args.judge or (configs[0].name if configs else None)
        if args.judge and args.judge not in judges:
            raise CommandError(f"--judge {args.judge!r} is not configured (have: {sorted(judges)})")
        generator = None
        if args.generator:  # handed to the detector when it is built (the prompt detector asks it)
            from faithproxy.clients.vllm import VLLMClient

            generator = deps["generator"] = VLLMClient(args.generator)
        detector = make_detector(args.detector, judges=judges, default_judge=default, **deps)

        async def go() -> Any:
            try:
                return await replay(chains, detector, judge=default, model=args.model,
                                    image_dir=args.images, concurrency=args.concurrency, batch=args.batch,
                                    kinds=args.kinds, progress=not args.no_progress)  # fmt: skip
            finally:
                await detector.aclose()
                stage = getattr(detector, "judge", None)  # the cascade's judge stage holds the backends
                if isinstance(stage, Detector):
                    await stage.aclose()
                if generator is not None:
                    await generator.aclose()

        predictions, report = asyncio.run(go())
        if args.out:
            write_chains(args.out, predictions)
        data = report.to_dict() | {"out": args.out}
        f1 = report.f1
        _print(args, data, [
            f"{report.detector}{'/' + report.judge if report.judge else ''}: {report.chains} chains, "
            f"{report.steps} steps, {report.detector_calls} detector calls, {report.errors} errors",
            f"unfaithful class vs the file's labels: precision {_fmt(f1['precision'])}  recall {_fmt(f1['recall'])}  "
            f"F1 {_fmt(f1['f1'])}  (faithful F1 {_fmt(f1['faithful']['f1'])}, AUROC {_fmt(f1['auroc'])})",
            f"judge calls {report.judge_calls if report.judge_calls is not None else '–'}, tokens in/out "
            f"{report.judge_input_tokens or 0}/{report.judge_output_tokens or 0}, generator tokens "
            f"{report.generator_tokens}",
            f"latency per call mean {_fmt(report.latency_mean_s, 3)} s, p50 {_fmt(report.latency_p50_s, 3)} s, "
            f"p95 {_fmt(report.latency_p95_s, 3)} s, per step {_fmt(report.detector_s_per_step, 3)} s; "
            f"wall {report.wall_s:.2f} s"
            + (f"; images not found {report.images_missing}" if report.images_missing else ""),
            *([f"cascade: perception steps decided by the probe {report.decided_by['probe']}, by the judge "
               f"{report.decided_by['judge']} (probe share {_fmt(report.probe_decided_share, 3)}; thresholds "
               f"{args.cascade_low}/{args.cascade_high})"] if report.decided_by is not None else []),
        ])  # fmt: skip
        return 0


class JudgeUpr:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", help="chains to label (labelled-chain file or proxy trace file)")
        parser.add_argument("--judge", help="judge name (default: the first configured)")
        parser.add_argument("--out", help="write the judge-labelled chains here")
        _add_view(parser)
        _add_judges(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from faithproxy.benchmarks.evaluation.judge_upr import judge_upr
        from faithproxy.benchmarks.evaluation.labelled import write_chains
        from faithproxy.benchmarks.evaluation.metrics import icc_between, step_f1
        from faithproxy.clients.judges import build_judges

        chains = _read(args.file, args.view)[: args.limit]
        configs = _judge_configs(args.judges)
        if not configs:
            raise CommandError("no judge configured (--judges or FAITHPROXY_JUDGES)")
        judges = build_judges(configs)
        name = args.judge or configs[0].name
        if name not in judges:
            raise CommandError(f"--judge {name!r} is not configured (have: {sorted(judges)})")

        async def go() -> Any:
            try:
                return await judge_upr(chains, judges[name], image_dir=args.images, concurrency=args.concurrency,
                                       progress=not args.no_progress)  # fmt: skip
            finally:
                for backend in judges.values():
                    await backend.aclose()

        labelled, report = asyncio.run(go())
        if args.out:
            write_chains(args.out, labelled)
        data = report.upr | {"judge": report.to_dict(), "out": args.out}
        lines = [
            f"UPR by judge {name}: {_fmt(report.upr['upr'])} = {report.upr['unfaithful_steps']} / "
            f"{report.upr['perception_steps']} perception steps over {report.chains} chains",
            f"judge calls {report.judge_calls}, tokens in/out {report.input_tokens}/{report.output_tokens}, "
            f"errors {report.errors}, sentences not covered {report.missing_sentences}",
        ]
        if any(s.labelled for c in chains for s in c.steps):  # the input had labels: agreement with them
            icc = icc_between(chains, labelled)
            f1 = step_f1(chains, labelled)
            data["agreement"] = {"icc_perception": icc.icc_perception, "icc_unfaithful": icc.icc_unfaithful,
                                 "f1": f1.to_dict()}  # fmt: skip
            lines.append(f"agreement with the file's labels: ICC perception {_fmt(icc.icc_perception)}, "
                         f"unfaithful {_fmt(icc.icc_unfaithful)}; unfaithful F1 {_fmt(f1.unfaithful.f1)}")  # fmt: skip
        _print(args, data, lines)
        return 0


def _json_objects(path: str) -> list[dict[str, Any]]:
    """The JSON object(s) of a file: one document (an object or a list of them) or one object per line."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError:
        data = [json.loads(line) for line in text.split("\n") if line.strip()]
    items = data if isinstance(data, list) else [data]
    if not all(isinstance(item, dict) for item in items):
        raise CommandError(f"{path}: expected JSON objects")
    return items


class Report:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--out", required=True, help="directory for report.md, report.json and the PNGs")
        parser.add_argument("--pair", nargs=3, action="append", default=[], metavar=("NAME", "VANILLA", "CORRECTED"),
                            help="Table 11 row: a benchmark's labelled chains without and with faithproxy")  # fmt: skip
        parser.add_argument("--swap", action="append", default=[], metavar="NAME=FILE",
                            help="Table 4 row: labelled chains of a corrected run with this detector")  # fmt: skip
        parser.add_argument("--regeneration", action="append", default=[], metavar="FILE",
                            help="Table 12: proxy trace files (or labelled chains converted from them)")  # fmt: skip
        parser.add_argument("--logprobs", action="append", default=[], metavar="FILE",
                            help="option-probability records for the FREAK-style curve (JSONL)")  # fmt: skip
        parser.add_argument("--replay", action="append", default=[], metavar="FILE",
                            help="Table 3: what `bench replay --json` printed (one per file, or JSONL)")  # fmt: skip
        parser.add_argument("--title", default="faithproxy benchmark report")
        parser.add_argument("--json", action="store_true")

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from faithproxy.benchmarks.evaluation.from_traces import iter_trace_records
        from faithproxy.benchmarks.evaluation.report import build_report, scores_beside

        swap = []
        for spec in args.swap:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise CommandError(f"--swap wants NAME=FILE, not {spec!r}")
            swap.append((name, _read(path)))
        pairs = [(name, _read(vanilla), _read(corrected)) for name, vanilla, corrected in args.pair]
        regeneration = [record for path in args.regeneration for _, record in iter_trace_records(path)]
        logprobs = [record for path in args.logprobs for _, record in iter_trace_records(path)]
        detectors = [report for path in args.replay for report in _json_objects(path)]
        if not (pairs or swap or regeneration or logprobs or detectors):
            raise CommandError("nothing to report: give --pair, --swap, --replay, --regeneration or --logprobs")
        # the runs' own scores (next to their chains) carry the figure of the paper's accuracy definition
        pair_scores = [(scores_beside(vanilla), scores_beside(corrected)) for _, vanilla, corrected in args.pair]
        data = build_report(args.out, pairs=pairs, swap=swap, regeneration=regeneration, logprobs=logprobs,
                            detectors=detectors, title=args.title, pair_scores=pair_scores)  # fmt: skip
        out = Path(args.out)
        _print(args, data | {"report": str(out / "report.md")},
               [f"wrote {out / 'report.md'} and {len(data['files'])} plot(s)"])  # fmt: skip
        return 0


class OptionCurve:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", help="multiple-choice chains with gold answers (labelled-chain or trace file)")
        parser.add_argument("--target", required=True, help="vLLM base URL (with or without /v1)")
        parser.add_argument("--model", required=True, help="the generator's model name")
        parser.add_argument("--out", required=True, help="JSONL records for `bench report --logprobs`")
        parser.add_argument("--options", default="ABCD", help="option letters (default ABCD)")
        parser.add_argument(
            "--answer-prefix", default=None, help="text after the steps, before the letter (no trailing space)"
        )
        parser.add_argument("--think-open", default="", help="text before the steps, e.g. '<think>\\n'")
        _add_view(parser, "original")
        _add_batch_options(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        from faithproxy.benchmarks.evaluation.option_curve import DEFAULT_ANSWER_PREFIX, CurveSettings, collect
        from faithproxy.benchmarks.evaluation.report import freak_curve
        from faithproxy.clients.vllm import VLLMClient

        chains = _read(args.file, args.view)[: args.limit]
        settings = CurveSettings(model=args.model, options=args.options.upper(), think_open=args.think_open,
                                 answer_prefix=args.answer_prefix if args.answer_prefix is not None
                                 else DEFAULT_ANSWER_PREFIX)  # fmt: skip
        base = args.target.rstrip("/").removesuffix("/v1")

        async def go() -> Any:
            client = VLLMClient(base)
            try:
                return await collect(client, chains, settings, image_dir=args.images, concurrency=args.concurrency,
                                     progress=not args.no_progress)  # fmt: skip
            finally:
                await client.aclose()

        records, failed = asyncio.run(go())
        with Path(args.out).open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        curve = freak_curve(records)
        data = {"chains": len(records), "failed_requests": failed, "out": args.out, "by_step": curve.by_step}
        lines = [f"wrote {len(records)} records to {args.out} ({failed} failed requests)"]
        lines += [f"after step {k}: P(correct) {p:.3f} over {n} chains" for k, p, _, n in curve.by_step]
        _print(args, data, lines)
        return 0


# -------------------------------------------------------------------------------------------- parsing


def _target(name: str) -> Any:
    module, _, attr = COMMANDS[name][0].partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """Every command is listed; only `selected` gets its arguments (its module is imported for that)."""
    parser = argparse.ArgumentParser(prog="faithproxy bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if name == selected:
            _target(name).add_arguments(command)
    return parser


_ERRORS: tuple[type[BaseException], ...] = (CommandError, ValueError, OSError)


def main(argv: list[str]) -> int:
    selected = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(selected).parse_args(argv)
    try:
        return int(_target(args.command).main(args) or 0)
    except _ERRORS as exc:  # format errors, metric mismatches, unknown detectors, unreadable files
        print(f"faithproxy bench {args.command}: error: {exc}", file=sys.stderr)
        return 2
