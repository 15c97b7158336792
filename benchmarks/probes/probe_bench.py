"""Probe, judge, prompt and cascade on labelled chains, with features from real vLLM (route 1).

    # 1. chains + hidden-state features + judge and self-check verdicts, from a vLLM it starts itself
    python -m faithproxy.benchmarks.probes.probe_bench collect --model-dir benchmarks/shapesworld/model/weights \\
        --data shapesworld \\
        --n 300 --out var/probe/sw-features.jsonl
    python -m faithproxy.benchmarks.probes.probe_bench collect --model-dir var/models/fixture-vlm --data fixture \\
        --out var/probe/fixture-features.jsonl
    # 2. train a probe on a chain split and compare the detectors on the held-out chains
    python -m faithproxy.benchmarks.probes.probe_bench compare --traces var/probe/sw-features.jsonl --labels judge

Data sets:
- `shapesworld`: the model's OWN greedy chains for held-out ShapesWorld items (`shapesworld.model.scoring
  .heldout_items`), served by vLLM; every step labelled by ground truth (`faithful`, from the scene's
  objects) and by the ShapesWorld judge (`detected`, the same claims checked against the objects its
  pixel parser reads from the image — the judge the proxy's tests use). The weights are an argument:
  the ShapesWorld model is retrained from time to time.
- `shapesworld-labelled`: ShapesWorld's labelled chains (`benchmarks/shapesworld/export.py`'s kind: reference
  chains, `--hallucination-rate` of them built on a perturbed belief, so unfaithful steps are rare),
  teacher-forced through the model on held-out scenes; labels as above.
- `fixture`: the tiny fixture model's chains and their trained rewrites (benchmarks/tinyvlm/fixture_spec.py),
  teacher-forced; labels from the spec (judge = oracle = ground truth). Tiny: a smoke test.

Features are read exactly as the proxy reads them (clients.hidden_states.HiddenStatesClient: one
prefill request per perception step, ending at that step), so the measured latency is the probe's
added latency per step. `prompt` is the proxy's self-check prompt asked of the generator (one request
per perception step, as detectors/prompt.py does).

`compare` trains a probe (benchmarks.probe_cli, class-weighted logistic, threshold from out-of-fold
scores of the training chains) and reports on the held-out chains: F1 on the unfaithful class of probe,
judge, prompt and cascade (probe decides outside [low, high], the judge inside) against the chosen
labels, the share of judge calls the cascade saves, and latencies. With `--labels judge` the judge's
own F1 is 1 by definition; use `--labels file` (ground truth) to score the judge too.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from faithproxy.benchmarks.probes import probe_cli
from faithproxy.benchmarks.shapesworld.model.corpus import HELDOUT_SEED, VALIDATION_SEED
from faithproxy.benchmarks.tinyvlm.processes import supervised
from faithproxy.clients.hidden_states import Features, HiddenStatesClient, default_layers, server_args
from faithproxy.clients.vllm import VLLMClient, assistant_text_of
from faithproxy.detectors.probe import features_of, parse_recipe
from faithproxy.detectors.self_check_prompt import build_self_check_prompt, parse_self_check
from faithproxy.faithcore.errors import UpstreamError
from faithproxy.faithcore.segmenter import segment_text

# ---- collect ----------------------------------------------------------------------------------


def check_seed(seed: int, *, for_evaluation: bool) -> str:
    """The split a ShapesWorld scene seed belongs to, or SystemExit when it may not be collected.

    Probes are trained on validation scenes (`corpus.VALIDATION_SEED`, the default): the held-out seed is
    the benchmark's, so its chains are collected only for evaluation (`--for-evaluation`), and seeds from
    `corpus.MIN_TRAINING_SEED` up are the generator's own training scenes, never collected at all.
    """
    from faithproxy.benchmarks.shapesworld.model.corpus import HELDOUT_SEED, MIN_TRAINING_SEED, VALIDATION_SEED

    if seed >= MIN_TRAINING_SEED:
        raise SystemExit(f"seed {seed} draws the generator's training scenes (seeds >= {MIN_TRAINING_SEED}): "
                         f"collect validation chains (--seed {VALIDATION_SEED}) instead")  # fmt: skip
    if seed == HELDOUT_SEED and not for_evaluation:
        raise SystemExit(f"seed {seed} is the held-out seed the benchmark scores on: collect training chains "
                         f"with --seed {VALIDATION_SEED}, or pass --for-evaluation for an evaluation set")  # fmt: skip
    if for_evaluation:
        return "heldout" if seed == HELDOUT_SEED else "evaluation"
    return "validation" if seed == VALIDATION_SEED else f"seed-{seed}"


def _shapesworld_items(n: int, seed: int) -> list[dict[str, Any]]:
    from faithproxy.benchmarks.shapesworld.model.corpus import user_message
    from faithproxy.benchmarks.shapesworld.model.evaluate import data_url
    from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items

    items = []
    for item in heldout_items(n, seed):
        items.append(
            {
                "id": item.id,
                "question": item.question.prompt,
                "messages": [user_message(item.question.prompt, data_url(item.scene))],
                "reply": None,  # generated
                "item": item,
            }
        )
    return items


def _labelled_items(n: int, rate: float, seed: int) -> list[dict[str, Any]]:
    """ShapesWorld labelled chains (reference chains, a share `rate` with a planted perturbed belief),
    teacher-forced: the chains of `benchmarks/shapesworld/export.py`, on the scenes of `seed`."""
    from faithproxy.benchmarks.shapesworld.dataset import generate_items
    from faithproxy.benchmarks.shapesworld.model.corpus import user_message
    from faithproxy.benchmarks.shapesworld.model.evaluate import data_url

    items = []
    for item in generate_items(seed, n, hallucination_rate=rate):
        items.append(
            {
                "id": item.id,
                "question": item.question.prompt,
                "messages": [user_message(item.question.prompt, data_url(item.scene))],
                "reply": item.chain.text(),
                "item": item,
            }
        )
    return items


def _shapesworld_labels(item: Any, sentences: list[str]) -> list[dict[str, Any]]:
    from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_chain, check_chain_image
    from faithproxy.benchmarks.shapesworld.scenes import render

    truth = check_chain(sentences, item.scene.objects).sentences
    judge = check_chain_image(render(item.scene), sentences).sentences
    out = []
    for t, j in zip(truth, judge, strict=True):
        perception = t.kind == PERCEPTION
        out.append(
            {
                "kind": "perception" if perception else "reasoning",
                "faithful": t.faithful if perception else None,
                "detected": None
                if not perception or j.faithful is None
                else ("faithful" if j.faithful else "unfaithful"),
            }
        )
    return out


def fixture_items() -> list[dict[str, Any]]:
    from faithproxy.benchmarks.tinyvlm import fixture_spec as spec

    items = []
    for f in spec.FIXTURES:
        for k, (sentences, answer) in enumerate(spec.chain_variants(f)):
            reply = f"<think>\n{' '.join(s.text for s in sentences)}\n</think>\n\n{spec.answer_text(answer)}"
            items.append(
                {
                    "id": f"{f.name}-{k}",
                    "question": f.question,
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "image_url", "image_url": {"url": spec.data_url(f.name)}},
                                {"type": "text", "text": f.question},
                            ],
                        }
                    ],
                    "reply": reply,
                    "labels": {s.text: s for s in sentences},
                }
            )
    return items


def _fixture_labels(item: dict[str, Any], sentences: list[str]) -> list[dict[str, Any]]:
    out = []
    for text in sentences:
        s = item["labels"].get(text)
        perception = s is not None and s.kind.value == "perception"
        label = None if not perception else ("faithful" if s.faithful else "unfaithful")
        out.append(
            {"kind": "perception" if perception else "reasoning", "faithful": s.faithful if perception else None,
             "detected": label}
        )  # fmt: skip
    return out


async def collect_one(
    item: dict[str, Any],
    model: str,
    vllm: VLLMClient,
    hidden: HiddenStatesClient,
    data: str,
    prompt: bool,
    recipes: Sequence[str] = (),
    images_dir: Path | None = None,
) -> dict[str, Any]:
    generated_s = None
    tokens = 0
    if item["reply"] is None:
        started = time.perf_counter()
        body = {"model": model, "messages": item["messages"], "max_tokens": 256, "temperature": 0.0}
        completion = await vllm.chat(body)
        generated_s = time.perf_counter() - started
        tokens = int((completion.get("usage") or {}).get("completion_tokens") or 0)
        item["reply"] = assistant_text_of(completion)
    segments = [s for s in segment_text(item["reply"]) if s.text]
    sentences = [s.text for s in segments]
    labels = _fixture_labels(item, sentences) if data == "fixture" else _shapesworld_labels(item["item"], sentences)
    perception = [i for i, lab in enumerate(labels) if lab["kind"] == "perception"]
    started = time.perf_counter()
    captured = await hidden.step_states(model, item["messages"], "", [s.raw for s in segments], perception)
    capture_s = time.perf_counter() - started
    verdicts: dict[int, str | None] = {}
    if prompt:
        answers = await asyncio.gather(
            *(_self_check(vllm, model, item, sentences[:i], sentences[i]) for i in perception)
        )
        verdicts = dict(zip(perception, answers, strict=True))
    steps = []
    for i, (segment, label) in enumerate(zip(segments, labels, strict=True)):
        step = {"index": i, "text": segment.text, "raw": segment.raw, **label}
        if i in captured:
            step["features"] = Features.last_token(captured[i]).to_json()
            if recipes:  # further recipes, computed as the probe detector computes them
                step["features_by_recipe"] = {
                    key: features_of(captured[i], parse_recipe(key)).to_json() for key in recipes
                }
            step["prompt"] = verdicts.get(i)
        steps.append(step)
    return {
        "id": item["id"],
        "model": model,
        **({"seed": item["seed"], "split": item["split"]} if "seed" in item else {}),
        "question": item["question"],  # the labelled-chain fields, so that bench replay reads the file
        "image": _save_image(item, images_dir),
        "prompt": item["question"],
        "steps": steps,
        "answer": item["reply"],
        "timings": {"generate_s": generated_s, "completion_tokens": tokens, "capture_s": capture_s,
                    "captured_steps": len(perception)},
    }  # fmt: skip


def _save_image(item: dict[str, Any], images_dir: Path | None) -> str | None:
    """The sha256 of the item's image (how bench replay's --images finds it), written to `images_dir`."""
    urls = [p["image_url"]["url"] for p in item["messages"][0]["content"] if p.get("type") == "image_url"]
    if not urls or not urls[0].startswith("data:"):
        return None
    data = base64.b64decode(urls[0].partition(",")[2])
    digest = hashlib.sha256(data).hexdigest()
    if images_dir is not None:
        images_dir.mkdir(parents=True, exist_ok=True)
        (images_dir / f"{item['id']}.png").write_bytes(data)
    return digest


async def _self_check(
    vllm: VLLMClient, model: str, item: dict[str, Any], prefix: list[str], sentence: str
) -> str | None:
    images = [p for p in item["messages"][0]["content"] if p.get("type") != "text"]
    text = build_self_check_prompt(item["question"], prefix, sentence)
    content = [*images, {"type": "text", "text": text}]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0.0}
    answer = parse_self_check(assistant_text_of(await vllm.chat(body)))
    return None if answer is None else ("faithful" if answer else "unfaithful")


# A chain whose request broke (a kept-alive connection vLLM closed, a reset) is asked again this many
# times in all; one lost chain must not cost a run of thousands its every record.
COLLECT_TRIES = 3


async def _collect(
    args: argparse.Namespace, base_url: str, layers: list[int]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The chains' records, in item order, and `id: error` for each chain that failed every try."""
    if args.data == "shapesworld":
        items = _shapesworld_items(args.n, args.seed)
    elif args.data == "shapesworld-labelled":
        items = _labelled_items(args.n, args.hallucination_rate, args.seed)
    else:
        items = fixture_items()
    if args.data != "fixture":
        split = check_seed(args.seed, for_evaluation=args.for_evaluation)
        for item in items:
            item |= {"seed": args.seed, "split": split}
    images_dir = Path(args.images or Path(args.out).with_suffix("").as_posix() + "-images")
    vllm = VLLMClient(base_url, request_timeout_s=600)
    hidden = HiddenStatesClient(vllm, layers)
    gate = asyncio.Semaphore(args.concurrency)

    failed: list[str] = []

    async def one(item: dict[str, Any]) -> dict[str, Any] | None:
        async with gate:
            for attempt in range(1, COLLECT_TRIES + 1):
                try:
                    return await collect_one(
                        item, args.served_name, vllm, hidden, args.data, not args.no_prompt, args.recipes, images_dir
                    )
                except UpstreamError as exc:
                    if attempt == COLLECT_TRIES:
                        failed.append(f"{item['id']}: {exc}")
            return None

    try:
        records = await asyncio.gather(*(one(item) for item in items))
    finally:
        await vllm.aclose()
    return [r for r in records if r is not None], failed


@supervised()  # a signal or a failure stops every server started inside
def collect(args: argparse.Namespace) -> int:
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    if args.data != "fixture":  # refused before vLLM starts
        check_seed(args.seed, for_evaluation=args.for_evaluation)
    for key in args.recipes:
        parse_recipe(key)
    if args.served_name is None:  # the proxy's probe refuses requests to another model name
        from faithproxy.benchmarks.shapesworld.model.evaluate import SERVED_NAME

        args.served_name = SERVED_NAME if args.data != "fixture" else "probe-bench-vlm"
    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    n_layers = int((config.get("text_config") or config)["num_hidden_layers"])
    layers = args.layers or default_layers(n_layers)
    storage = Path(args.storage or Path(args.out).parent / "hidden-states")
    storage.mkdir(parents=True, exist_ok=True)
    repo = str(Path(__file__).resolve().parents[2])
    server = start_vllm(
        args.model_dir,
        extra_args=server_args(layers, str(storage.resolve())),
        served_model_name=args.served_name,
        log_path=Path(args.out).with_suffix(".vllm.log"),
        env={"PYTHONPATH": repo},
    )
    started = time.perf_counter()
    try:
        records, failed = asyncio.run(_collect(args, server.base_url, layers))
    finally:
        server.stop()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    steps = sum(r["timings"]["captured_steps"] for r in records)
    seconds = time.perf_counter() - started
    print(f"{len(records)} chains, {steps} perception steps with features, layers {layers} → {out} ({seconds:.0f}s)")
    if failed:  # the file holds the others; the exit status says it is short
        print(f"{len(failed)} chains failed {COLLECT_TRIES} tries and are not in it:", *failed[:10], sep="\n  ")
        return 1
    return 0


# ---- compare ----------------------------------------------------------------------------------


def compare(args: argparse.Namespace) -> int:
    records = [json.loads(line) for path in args.traces for line in Path(path).read_text().splitlines() if line.strip()]
    data = probe_cli.load_traces(args.traces, args.labels, None, args.layers)
    fit_mask, val_mask = probe_cli.split_chains(data.chain, args.val_fraction, args.seed)
    if args.train_early:  # the paper's setting: train on steps i <= 2 only, test on all positions
        fit_mask = fit_mask & (data.position <= probe_cli.EARLY)
    x, y = data.x[fit_mask], data.y[fit_mask]
    chains = [c for c, m in zip(data.chain, fit_mask, strict=True) if m]
    threshold = probe_cli.best_threshold(y, probe_cli.out_of_fold(x, y, chains, args.classifier, args.l2, args.seed))
    classifier = probe_cli.fit(x, y, kind=args.classifier, l2=args.l2, seed=args.seed)
    started = time.perf_counter()
    scores = probe_cli.scores_of(classifier, data.x[val_mask])
    predict_s = (time.perf_counter() - started) / max(1, int(val_mask.sum()))
    yv, pos = data.y[val_mask], data.position[val_mask]

    # the judge's and the prompt's verdicts for the same rows (same order as load_traces)
    judge, prompt = [], []
    for record in records:
        for step in record["steps"]:
            if step.get("kind") != "perception" or not step.get("features"):
                continue
            if probe_cli._label(record, step, args.labels, {}, False) is None:
                continue
            judge.append(step.get("detected"))
            prompt.append(step.get("prompt"))
    judge_v = np.asarray([1 if v == "unfaithful" else 0 for v in judge])[val_mask]
    prompt_raw = np.asarray(prompt, dtype=object)[val_mask]
    prompt_v = np.asarray([1 if v == "unfaithful" else 0 for v in prompt_raw])

    print(f"{len(records)} chains; held-out: {int(val_mask.sum())} perception steps of "
          f"{len(set(c for c, m in zip(data.chain, val_mask, strict=True) if m))} chains, "
          f"{int(yv.sum())} unfaithful ({yv.mean():.1%}); labels: {args.labels}")  # fmt: skip
    print(f"train: {int(fit_mask.sum())} steps, {int(y.sum())} unfaithful; threshold {threshold:.3f} (out-of-fold F1)")
    rows = {
        "probe": probe_cli.report(yv, scores, pos, threshold),
        "judge": probe_cli.binary_metrics(yv, judge_v),
        "prompt": probe_cli.binary_metrics(yv, prompt_v),
        # what F1 on the unfaithful class gives for free at this class balance
        "baseline: all unfaithful": probe_cli.binary_metrics(yv, np.ones_like(yv)),
    }
    answered = np.asarray([v is not None for v in prompt_raw])
    print(f"{'detector':<22} {'P':>6} {'R':>6} {'F1':>6} {'AUROC':>6}  judge calls")
    for name, m in rows.items():
        au = f"{m['auroc']:.3f}" if m.get("auroc") is not None else "-"
        calls = f"{len(yv)}" if name == "judge" else "0"
        print(f"{name:<22} {_prf(m)} {au:>6}  {calls}")
    if not answered.all():
        print(f"  (prompt: {int((~answered).sum())} unparseable self-check replies counted as faithful)")
    for name, part in rows["probe"]["by_position"].items():
        au = f"{part['auroc']:.3f}" if part.get("auroc") is not None else "-"
        print(f"  probe {name:<16} {_prf(part)} {au:>6}  (n={part['n']})")
    judge_f1 = rows["judge"]["f1"]
    for low, high in args.cascade:
        confident = (scores < low) | (scores > high)
        decided = np.where(confident, (scores > high).astype(int), judge_v)
        m = probe_cli.binary_metrics(yv, decided)
        saved = confident.mean()
        name = f"cascade [{low:.2f},{high:.2f}]"
        lost = 100 * (m["f1"] - judge_f1)
        print(
            f"{name:<22} {_prf(m)} {'-':>6}  {int((~confident).sum())} ({saved:.0%} saved, F1 {lost:+.1f} pts vs judge)"
        )
    capture = [r["timings"] for r in records if r["timings"]["captured_steps"]]
    per_step = sum(t["capture_s"] for t in capture) / max(1, sum(t["captured_steps"] for t in capture))
    per_chain = sum(t["capture_s"] for t in capture) / max(1, len(capture))
    print(f"probe latency: features {1000 * per_chain:.0f} ms per chain's perception steps (concurrent), "
          f"{1000 * per_step:.0f} ms per step amortised; classifier {1e6 * predict_s:.0f} µs per step")  # fmt: skip
    generated = [t for t in (r["timings"] for r in records) if t.get("generate_s")]
    if generated:
        tokens = sum(t["completion_tokens"] for t in generated)
        print(f"generation (capture on, {args.concurrency_note}): {tokens} tokens, "
              f"{tokens / sum(t['generate_s'] for t in generated):.0f} tokens/s per request")  # fmt: skip
    return 0


def _prf(m: dict[str, Any]) -> str:
    return f"{m['precision']:>6.3f} {m['recall']:>6.3f} {m['f1']:>6.3f}"


def _pair(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.probes.probe_bench", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="start vLLM with hidden-state capture, write feature traces")
    c.add_argument("--model-dir", required=True)
    c.add_argument("--data", choices=("shapesworld", "shapesworld-labelled", "fixture"), required=True)
    c.add_argument("--hallucination-rate", type=float, default=0.25, help="shapesworld-labelled: planted chains")
    c.add_argument("--n", type=int, default=150, help="shapesworld: items (scenes) of --seed")
    c.add_argument("--seed", type=int, default=VALIDATION_SEED,
                   help=f"shapesworld: scene seed (default {VALIDATION_SEED}, the validation scenes)")  # fmt: skip
    c.add_argument("--for-evaluation", action="store_true",
                   help=f"allows seed {HELDOUT_SEED} (held out): evaluation data, refused by probe train")  # fmt: skip
    c.add_argument("--recipes", nargs="+", default=[], metavar="RECIPE",
                   help="also store these feature recipes per step (mean_last_K), besides last_token")  # fmt: skip
    c.add_argument("--out", required=True)
    c.add_argument("--images", help="where the chains' images go (default: OUT without .jsonl + '-images')")
    c.add_argument("--served-name", help="default: shapesworld-vlm for ShapesWorld data (the bench's name)")
    c.add_argument("--layers", type=int, nargs="+", help="vLLM layer ids (default: a middle and the last)")
    c.add_argument("--storage", help="where vLLM writes hidden-state files (default: beside --out)")
    c.add_argument("--concurrency", type=int, default=4)
    c.add_argument("--no-prompt", action="store_true", help="skip the self-check (prompt) detector")
    c.set_defaults(func=collect)
    m = sub.add_parser("compare", help="train a probe on a chain split, compare the detectors")
    m.add_argument("--traces", nargs="+", required=True)
    m.add_argument("--labels", choices=("judge", "file"), default="judge")
    m.add_argument("--layers", type=int, nargs="+")
    m.add_argument("--classifier", choices=("logistic", "mlp"), default="logistic")
    m.add_argument("--l2", type=float, default=1e-2)
    m.add_argument("--val-fraction", type=float, default=0.3)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--train-early", action="store_true", help="fit on steps i <= 2 only (the paper's setting)")
    m.add_argument(
        "--cascade",
        type=_pair,
        nargs="+",
        default=[(0.05, 0.95), (0.1, 0.9), (0.2, 0.8), (0.3, 0.7)],
        help="low,high pairs",
    )
    m.add_argument("--concurrency-note", default="4 concurrent chains", help=argparse.SUPPRESS)
    m.set_defaults(func=compare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
