"""How often early stop when the model insists is right, on ShapesWorld ground truth.

    faithproxy bench insist --traces var/bench/traces-judge-learned.jsonl --seed 997 --start 1600 --n 150
    faithproxy bench insist --labelled var/val/validation-vanilla.jsonl --seed 997 --n 100 --precision 0.16 \
        --out benchmarks/results/insist-validation.json

The proxy's `REGENERATION_INSIST_SHARE` (ReflectRegenerator's `insist_share`) keeps a flagged step without
spending its other tries when at least that share of a sampled try's rewrites restate the flagged
sentence. Keeping it is right when the flag was false: the sentence is true by ground truth
(`shapesworld.claims` on the scene's true objects); it is wrong when the sentence is false, because the
other tries might have fixed it.

This takes the flags a detector raised in a `faithproxy bench shapesworld` run (its traces: every first
draft whose detector verdict was UNFAITHFUL; `--seed`, `--start` and `--n` must be the run's, so each
trace finds its scene by image hash), asks the generator for the rewrites of the first sampled try
(`ReflectRegenerator.sampled_rewrites`, try 2: the samples and seeds the proxy would use, on a vLLM of
the committed ShapesWorld model started here unless `--base-url` names one), and prints, for each share,
how many steps would stop, how many of those stops are right, and what the run's rewrites did with the
steps that would have stopped (true flags fixed: a fix lost by stopping; false flags rewritten: a change
of a true sentence that stopping saves). With `--labelled` (ground-truth labelled chains) every perception
step is taken as if flagged, which gives the rule's stop rate on true and on false sentences whatever
detector flags them, and the share of stops that are right for a detector of flag precision
`--precision`. Choose a share on validation-seed runs only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faithproxy.clients.vllm import VLLMClient

SHARES = (0.5, 0.625, 0.75, 0.875, 1.0)
ATTEMPT = 2  # the first sampled try when the greedy try 1 gave a rewrite the detector rejected


@dataclass(frozen=True)
class Flag:
    """One flagged first draft and what the run did with it."""

    item_id: str
    draft: str
    prefix: tuple[str, ...]  # the accepted sentences before it, as the regenerator is given them
    true: bool  # the draft is true by ground truth: the flag was false
    fixed: bool  # the run replaced it with a sentence true by ground truth
    rewritten: bool
    attempts: int
    restated: float | None = None  # share of the sampled try's rewrites restating the draft


def flags_of(traces: Iterable[dict[str, Any]], items: Sequence[Any]) -> list[Flag]:
    """The flagged perception drafts of the traces, with their ground truth; a trace whose image is none
    of the items' is an error (the run's --seed/--start/--n were not these)."""
    from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_sentence
    from faithproxy.benchmarks.shapesworld.export import image_sha256

    by_image = {image_sha256(item.scene): item for item in items}
    out = []
    for trace in traces:
        item = next((by_image[h] for h in trace.get("images") or () if h in by_image), None)
        if item is None:
            raise ValueError(f"trace {trace.get('id')}: its image is not one of the items (--seed, --start, --n)")
        accepted: list[str] = []
        for step in trace["steps"]:
            draft = step["original_text"] if step["original_text"] is not None else step["text"]
            check = check_sentence(draft.strip(), item.scene.objects)
            if step["detected"] == "unfaithful" and check.kind == PERCEPTION:
                rewritten = step["original_text"] is not None
                now = check_sentence(step["text"].strip(), item.scene.objects)
                out.append(
                    Flag(
                        item_id=item.id,
                        draft=draft.strip(),
                        prefix=tuple(accepted),
                        true=check.faithful is not False,
                        fixed=rewritten and now.faithful is not False and check.faithful is False,
                        rewritten=rewritten,
                        attempts=int(step.get("attempts") or 0),
                    )
                )
            accepted.append(step["text"].strip())
    return out


def steps_of_labelled(records: Iterable[dict[str, Any]], items: Sequence[Any]) -> list[Flag]:
    """Every perception step of labelled chains (`benchmarks/evaluation/labelled.py`, e.g. the vanilla
    chains `bench shapesworld --labelled-dir` writes) as if flagged: the rule's stop rate on true and on
    false sentences, whatever a detector would flag."""
    by_image = {_image(item): item for item in items}
    out = []
    for record in records:
        item = by_image.get(record.get("image"))
        if item is None:
            raise ValueError(f"record {record.get('id')}: its image is not one of the items (--seed, --start, --n)")
        texts = [step["text"].strip() for step in record["steps"]]
        for i, step in enumerate(record["steps"]):
            if step.get("kind") == "perception" and step.get("faithful") is not None:
                out.append(Flag(item.id, texts[i], tuple(texts[:i]), bool(step["faithful"]), False, False, 0))
    return out


def _image(item: Any) -> str:
    from faithproxy.benchmarks.shapesworld.export import image_sha256

    return image_sha256(item.scene)


def stop_rates(flags: Sequence[Flag], shares: Sequence[float] = SHARES) -> list[dict[str, Any]]:
    """Per share: the stop rate on true sentences and on false ones. For a detector of precision P, the
    share of its stops that are right is (1 - P) * on_true / ((1 - P) * on_true + P * on_false)."""
    measured = [f for f in flags if f.restated is not None]
    true = [f for f in measured if f.true]
    false = [f for f in measured if not f.true]
    rows = []
    for share in shares:
        on_true = sum(f.restated is not None and f.restated >= share for f in true) / len(true) if true else None
        on_false = sum(f.restated is not None and f.restated >= share for f in false) / len(false) if false else None
        rows.append({"insist_share": share, "true": len(true), "false": len(false),
                     "stop_rate_true": on_true, "stop_rate_false": on_false})  # fmt: skip
    return rows


def right_share_at(rate: dict[str, Any], precision: float) -> float | None:
    """The share of stops that are right for a detector whose flags are false sentences at `precision`."""
    a, b = rate["stop_rate_true"], rate["stop_rate_false"]
    if a is None or b is None or (1 - precision) * a + precision * b == 0:
        return None
    return round((1 - precision) * a / ((1 - precision) * a + precision * b), 4)


def stop_table(flags: Sequence[Flag], shares: Sequence[float] = SHARES) -> list[dict[str, Any]]:
    """Per share: the steps that would stop, how many stops are right (the draft is true), and what the
    run's rewrites did with them."""
    measured = [f for f in flags if f.restated is not None]
    rows = []
    for share in shares:
        stops = [f for f in measured if f.restated is not None and f.restated >= share]
        right = sum(f.true for f in stops)
        rows.append(
            {
                "insist_share": share,
                "flags": len(measured),
                "stops": len(stops),
                "right": right,
                "wrong": len(stops) - right,
                "right_share": round(right / len(stops), 4) if stops else None,
                "false_flags_stopped": right,
                "false_flags": sum(f.true for f in measured),
                "true_flags_stopped": len(stops) - right,
                "true_flags": sum(not f.true for f in measured),
                "fixes_lost": sum(f.fixed for f in stops),
                "true_sentences_rewritten_saved": sum(f.true and f.rewritten for f in stops),
                "tries_on_stopped_steps_in_the_run": sum(f.attempts for f in stops),
            }
        )
    return rows


async def measure(
    flags: Sequence[Flag], items: Sequence[Any], client: VLLMClient, samples: int, concurrency: int
) -> list[Flag]:
    """Each flag with the share of its sampled try's rewrites that restate it (`client`: the generator)."""
    from faithproxy.benchmarks.shapesworld.model.corpus import user_message
    from faithproxy.benchmarks.shapesworld.model.evaluate import SERVED_NAME, data_url
    from faithproxy.faithcore.context import RequestView
    from faithproxy.faithcore.types import Step, StepKind
    from faithproxy.regenerators.reflect import ReflectRegenerator, restated_share

    by_id = {item.id: item for item in items}
    gate = asyncio.Semaphore(concurrency)
    regenerator = ReflectRegenerator(client, samples=samples)

    async def one(flag: Flag) -> Flag:
        item = by_id[flag.item_id]
        view = RequestView(flag.item_id, SERVED_NAME, [user_message(item.question.prompt, data_url(item.scene))],
                           item.question.prompt)  # fmt: skip
        step = Step(index=len(flag.prefix), text=flag.draft, raw=flag.draft, kind=StepKind.PERCEPTION)
        async with gate:
            rewrites = await regenerator.sampled_rewrites(view, list(flag.prefix), step, ATTEMPT)
        return Flag(**{**asdict(flag), "prefix": flag.prefix, "restated": restated_share(rewrites, flag.draft)})

    return list(await asyncio.gather(*(one(f) for f in flags)))


async def _measure_at(
    flags: Sequence[Flag], items: Sequence[Any], base_url: str, args: argparse.Namespace
) -> list[Flag]:
    from faithproxy.clients.vllm import VLLMClient

    client = VLLMClient(base_url, request_timeout_s=600)
    try:
        return await measure(flags, items, client, args.samples, args.concurrency)
    finally:
        await client.aclose()


def markdown(rows: Sequence[dict[str, Any]], rates: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    what = "flags of" if meta["input"] == "traces" else "perception steps (every one, as if flagged) of"
    lines = [
        f"Early stop when the model insists: {meta['flags']} {what} `{meta['source']}` (scenes' seed "
        f"{meta['seed']}, items {meta['start']}..{meta['start'] + meta['n'] - 1}), {meta['samples']} samples at try "
        f"{ATTEMPT}; a stop is right when the sentence is true by ground truth.",
        "",
        "| insist share | stops | right | wrong | right share | true sentences stopped | false sentences stopped | "
        f"fixes lost | true sentences not rewritten | right share at precision {meta['precision']} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, rate in zip(rows, rates, strict=True):
        share = "–" if r["right_share"] is None else f"{r['right_share']:.2f}"
        at = right_share_at(rate, meta["precision"])
        lines.append(
            f"| {r['insist_share']} | {r['stops']} | {r['right']} | {r['wrong']} | {share} | "
            f"{r['false_flags_stopped']} of {r['false_flags']} | {r['true_flags_stopped']} of {r['true_flags']} | "
            f"{r['fixes_lost']} | {r['true_sentences_rewritten_saved']} | {'–' if at is None else f'{at:.2f}'} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--traces", type=Path, help="a bench shapesworld row's traces (JSONL): its flags")
    source.add_argument("--labelled", type=Path, help="labelled chains (JSONL): every perception step")
    parser.add_argument("--seed", type=int, required=True, help="the run's scenes' seed")
    parser.add_argument("--start", type=int, default=0, help="the run's first item")
    parser.add_argument("--n", type=int, required=True, help="the run's chains")
    parser.add_argument("--limit", type=int, help="measure the first LIMIT steps only")
    parser.add_argument("--samples", type=int, default=8, help="rewrites per sampled try (REGENERATION_SAMPLES)")
    parser.add_argument(
        "--precision",
        type=float,
        default=0.5,
        help="a detector's flag precision, for the right share its stops would have",
    )
    parser.add_argument("--base-url", help="a vLLM serving the ShapesWorld model (its root URL); default: start one")
    parser.add_argument("--model", type=Path, help="the ShapesWorld model folder (default: the committed one)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, help="result JSON (the flags with their shares, and the table)")


def _read(args: argparse.Namespace, items: Sequence[Any]) -> list[Flag]:
    path = args.traces or args.labelled
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    try:
        flags = flags_of(records, items) if args.traces else steps_of_labelled(records, items)
    except ValueError as exc:
        raise SystemExit(f"--{'traces' if args.traces else 'labelled'}: {exc}") from exc
    return flags[: args.limit] if args.limit else flags


def main(args: argparse.Namespace) -> int:
    from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
    from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items

    if args.samples < 1 or args.n < 1 or args.start < 0 or not 0 <= args.precision <= 1:
        raise SystemExit("--samples and --n must be at least 1, --start at least 0, --precision from 0 to 1")
    items = heldout_items(args.n, args.seed, start=args.start)
    flags = _read(args, items)
    source = args.traces or args.labelled
    if args.base_url is not None:
        measured = asyncio.run(_measure_at(flags, items, args.base_url, args))
    else:
        from faithproxy.benchmarks.shapesworld.model.evaluate import SERVED_NAME
        from faithproxy.benchmarks.tinyvlm.serve import start_vllm

        log = source.with_name("insist-vllm.log")
        with start_vllm(args.model or WEIGHTS_DIR, served_model_name=SERVED_NAME, log_path=log) as server:
            measured = asyncio.run(_measure_at(flags, items, server.base_url, args))
    rows, rates = stop_table(measured), stop_rates(measured)
    meta = {"input": "traces" if args.traces else "labelled", "source": str(source), "seed": args.seed,
            "start": args.start, "n": args.n, "samples": args.samples, "attempt": ATTEMPT, "flags": len(measured),
            "precision": args.precision}  # fmt: skip
    text = markdown(rows, rates, meta)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = meta | {"table": rows, "rates": rates, "flags_measured": [asdict(f) for f in measured]}
        args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    cli = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.evaluation.insist_bench", description=__doc__.split("\n\n")[0]
    )
    add_arguments(cli)
    sys.exit(main(cli.parse_args()))
