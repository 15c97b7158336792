"""The flywheel measured on ShapesWorld: pairs from the proxy's corrections on development scenes, the
generator tuned on them, and the tuned model on held-out scenes, vanilla and behind the proxy.

    python -m faithproxy.benchmarks.evaluation.flywheel_loop images --seed 997 --n 150 --out var/flywheel/images
    python -m faithproxy.benchmarks.evaluation.flywheel_loop truth --pairs pairs.jsonl --seed 997:150 --seed 999:150
    python -m faithproxy.benchmarks.evaluation.flywheel_loop measure --name base --model MODEL --rows judge:learned \
        --workdir var/flywheel/eval-base --out benchmarks/results/flywheel-base.json
    python -m faithproxy.benchmarks.evaluation.flywheel_loop compare RESULT.json... \
        --out benchmarks/results/flywheel-loop.json

Pairs are collected with `faithproxy bench shapesworld` (its traces, on seeds 997 and 999 only) and
`faithproxy export pairs`; `images` writes the scenes' PNGs, byte for byte what the bench sent as data
URLs, so the exporter finds each request's image by its sha256. `truth` scores every pair by the scene's
ground truth (a team would not know it). `measure` runs the bench on the held-out seed frozen in
benchmarks/results/flywheel-frozen-options.json and adds per-chain intervals (bootstrap over chains) to
UPR, accuracy, flags, judge calls and regenerations; `compare` sets results side by side with paired
intervals on the differences.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from faithproxy.flywheel.pairs import read_jsonl

REPO = Path(__file__).resolve().parents[2]
FROZEN = REPO / "benchmarks" / "results" / "flywheel-frozen-options.json"
DEVELOPMENT_SEEDS = (997, 999)
BOOTSTRAP = 2000


def frozen_options() -> dict[str, Any]:
    return json.loads(FROZEN.read_text(encoding="utf-8"))


def _items(seed: int, n: int) -> list[Any]:
    """The bench's items of `seed` (scoring.heldout_items, without importing the scorer and its nltk)."""
    from faithproxy.benchmarks.shapesworld.dataset import generate_items
    from faithproxy.benchmarks.shapesworld.model.corpus import JOINED_EXISTENCE

    return list(generate_items(seed, n, joined=JOINED_EXISTENCE))


def generate(models: dict[str, Path], seed: int, n: int, device: str, batch_size: int = 100) -> dict[str, Any]:
    """Greedy chains of each model alone on `seed`'s first `n` items, in transformers on `device`:
    the vanilla pass, which needs no vLLM and so can run where a GPU is (its replies are scored here)."""
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from faithproxy.benchmarks.shapesworld.model.corpus import user_message
    from faithproxy.benchmarks.shapesworld.scenes import render
    from faithproxy.benchmarks.tinyvlm.hf_reference import prompt_text

    items = _items(seed, n)
    texts, images = [i.question.prompt for i in items], [render(i.scene) for i in items]
    out: dict[str, Any] = {"seed": seed, "n": n, "device": device, "torch": torch.__version__, "replies": {}}
    for name, folder in models.items():
        net = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval().to(device)
        processor = AutoProcessor.from_pretrained(folder)
        tok = processor.tokenizer
        tok.padding_side = "left"  # as shapesworld.model.greedy.generate_batch
        started, replies = time.time(), []
        for at in range(0, n, batch_size):
            prompts = [prompt_text(tok, [user_message(t)]) for t in texts[at : at + batch_size]]
            inputs = processor(text=prompts, images=images[at : at + batch_size], padding=True, return_tensors="pt")
            with torch.inference_mode():
                ids = net.generate(**inputs.to(device), max_new_tokens=160, do_sample=False)
            replies += tok.batch_decode(ids[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        weights = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        out["replies"][name] = {"model": str(folder), "sha256": weights, "replies": replies,
                                "wall_s": round(time.time() - started, 1)}  # fmt: skip
    return out


def write_images(seed: int, n: int, out: Path) -> int:
    """The scenes' PNGs, named by their sha256 (the bytes the bench sends as data URLs)."""
    from faithproxy.benchmarks.shapesworld.scenes import png_bytes, render

    out.mkdir(parents=True, exist_ok=True)
    for item in _items(seed, n):
        data = png_bytes(render(item.scene))
        (out / f"{hashlib.sha256(data).hexdigest()}.png").write_bytes(data)
    return n


def pair_truth(pairs: Sequence[dict[str, Any]], seeds: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """How many pairs are right by ground truth: the rewrite true and the flagged step false."""
    from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_sentence
    from faithproxy.benchmarks.shapesworld.export import image_sha256

    scenes = {image_sha256(item.scene): item.scene for seed, n in seeds for item in _items(seed, n)}
    outcome: dict[str, int] = {}
    for pair in pairs:
        meta = pair["metadata"]
        scene = scenes.get(meta["image_sha256"][0])
        if scene is None:
            key = "scene_unknown"
        else:
            chosen = check_sentence(meta["chosen_step"], scene.objects)
            rejected = check_sentence(meta["rejected_step"], scene.objects)
            if chosen.kind != PERCEPTION or rejected.kind != PERCEPTION:
                key = "not_perception"
            else:
                truth = {True: "true", False: "false"}
                key = f"chosen_{truth[bool(chosen.faithful)]}_rejected_{truth[bool(rejected.faithful)]}"
        outcome[key] = outcome.get(key, 0) + 1
    right = outcome.get("chosen_true_rejected_false", 0)
    return {"pairs": len(pairs), "right": right, "right_share": round(right / len(pairs), 4) if pairs else None,
            "outcomes": dict(sorted(outcome.items()))}  # fmt: skip


# ------------------------------------------------------------------------------------- per-chain figures


def chain_rows(items: Sequence[Any], replies: Sequence[str], summaries: Sequence[dict[str, Any]] | None) -> list[dict]:
    """Per chain: perception steps and false ones by ground truth, the answer right or not, and behind
    the proxy its flags, judge calls and regenerations."""
    from faithproxy.benchmarks.shapesworld.model.scoring import score_reply

    rows = []
    for i, (item, reply) in enumerate(zip(items, replies, strict=True)):
        score = score_reply(item, reply)
        row = {"steps": score.perception_steps, "false": score.perception_errors, "correct": int(score.correct)}
        if summaries is not None:
            s = summaries[i] or {}
            row |= {
                "flags": s.get("unfaithful_detected", 0),
                "judge_calls": (s.get("judge") or {}).get("calls", 0),
                "regenerations": s.get("regenerations", 0),
            }
        rows.append(row)
    return rows


def _figures(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    steps = sum(r["steps"] for r in rows)
    out = {"upr": sum(r["false"] for r in rows) / steps if steps else 0.0}
    for key in ("correct", "flags", "judge_calls", "regenerations"):
        if rows and key in rows[0]:
            out["accuracy" if key == "correct" else f"{key}_per_chain"] = sum(r[key] for r in rows) / len(rows)
    return out


def with_intervals(
    rows: Sequence[dict[str, Any]], figures: Callable[[Sequence[dict[str, Any]]], dict[str, float]] = _figures
) -> dict[str, Any]:
    """Each figure with a 95% percentile-bootstrap interval over chains (seeded, BOOTSTRAP resamples)."""
    point = figures(rows)
    rng = random.Random(0)
    draws: dict[str, list[float]] = {k: [] for k in point}
    for _ in range(BOOTSTRAP):
        sample = [rows[rng.randrange(len(rows))] for _ in rows]
        for k, v in figures(sample).items():
            draws[k].append(v)
    out: dict[str, Any] = {"chains": len(rows)}
    for k, v in point.items():
        d = sorted(draws[k])
        out[k] = {
            "value": round(v, 4),
            "ci95": [round(d[int(0.025 * len(d))], 4), round(d[int(0.975 * len(d)) - 1], 4)],
        }
    return out


def paired_difference(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """b − a on the same items, each figure with a paired bootstrap interval."""

    def diff(pairs: Sequence[dict[str, Any]]) -> dict[str, float]:
        fa, fb = _figures([p["a"] for p in pairs]), _figures([p["b"] for p in pairs])
        return {k: fb[k] - fa[k] for k in fa if k in fb}

    return with_intervals([{"a": x, "b": y} for x, y in zip(a, b, strict=True)], diff)


# ---------------------------------------------------------------------------------------------- measure


def measure(name: str, model: Path, rows: Sequence[str], workdir: Path, n: int, seed: int) -> dict[str, Any]:
    """The bench on `seed` (vanilla and each row behind the proxy), with per-chain rows and intervals."""
    from faithproxy.benchmarks.evaluation.shapesworld_bench import JUDGE_WEIGHTS_DIR, benchmark, git_commit

    started = time.time()
    result = benchmark(model, n, list(rows), 8, workdir, 3, seed=seed, judge_model=JUDGE_WEIGHTS_DIR)
    items = _items(seed, n)
    vanilla = json.loads((workdir / "raw-vanilla.json").read_text(encoding="utf-8"))
    per_chain = {"vanilla": chain_rows(items, vanilla["replies"], None)}
    for row in rows:
        raw = json.loads((workdir / f"raw-{row.replace(':', '-')}.json").read_text(encoding="utf-8"))
        replies = raw["row"]["replies"]
        per_chain[row] = chain_rows(items, [c for c, _, _ in replies], [s for _, _, s in replies])
    result.pop("labelled", None)
    return {
        "name": name,
        "model": str(model),
        "model_sha256": result["models"]["generator"]["sha256"],
        "scenes_seed": seed,
        "n_chains": n,
        "figures": {config: with_intervals(chains) for config, chains in per_chain.items()},
        "per_chain": per_chain,
        "bench": {k: v for k, v in result.items() if k in ("vanilla", "detectors", "goals")},
        "commit": git_commit(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "machine": f"{platform.machine()}, {platform.node()}, 2 shared CPU cores, no GPU",
    }


def vanilla_transformers(
    name: str, model: Path, n: int, seed: int, threads: int = 2, generated: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Greedy chains of the model alone, generated in transformers (batched, on the CPU): the vanilla
    figures without a vLLM, whose start and throughput a loaded 2-core machine cannot afford three times.
    The bench's parity check (benchmarks/shapesworld/model/evaluate.py) compares the two decoders on these prompts."""
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from faithproxy.benchmarks.evaluation.shapesworld_bench import git_commit
    from faithproxy.benchmarks.shapesworld.model.greedy import generate_in_batches
    from faithproxy.benchmarks.shapesworld.scenes import render
    from faithproxy.benchmarks.tinyvlm.digest import file_sha256

    torch.set_num_threads(threads)
    started = time.time()
    items = _items(seed, n)
    if generated is None:
        net = Qwen2_5_VLForConditionalGeneration.from_pretrained(model, dtype=torch.float32).eval()
        processor = AutoProcessor.from_pretrained(model)
        texts, images = [i.question.prompt for i in items], [render(i.scene) for i in items]
        replies = generate_in_batches(net, processor, texts, images)
        decoder = "transformers greedy on this machine's CPU (shapesworld.model.greedy), max 160 new tokens"
    else:  # `generate`'s output for this model, made elsewhere (a GPU machine)
        if (generated["seed"], generated["n"]) != (seed, n):
            raise SystemExit(f"--replies holds seed {generated['seed']} n {generated['n']}, not {seed} {n}")
        replies, sha256 = generated["replies"][name]["replies"], generated["replies"][name]["sha256"]
        decoder = f"transformers greedy on {generated['device']} (torch {generated['torch']}), max 160 new tokens"
    per_chain = {"vanilla": chain_rows(items, replies, None)}
    return {
        "name": name,
        "model": str(model),
        "model_sha256": file_sha256(model / "model.safetensors") if generated is None else sha256,
        "scenes_seed": seed,
        "n_chains": n,
        "decoder": decoder,
        "figures": {config: with_intervals(chains) for config, chains in per_chain.items()},
        "per_chain": per_chain,
        "replies": replies,
        "commit": git_commit(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "machine": f"{platform.machine()}, {platform.node()}, 2 shared CPU cores, no GPU",
    }


def compare(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every result's figures, and each later result's paired differences against the first."""
    base = results[0]
    out: dict[str, Any] = {"base": base["name"], "figures": {r["name"]: r["figures"] for r in results}, "vs_base": {}}
    for other in results[1:]:
        out["vs_base"][other["name"]] = {
            config: paired_difference(base["per_chain"][config], other["per_chain"][config])
            for config in other["per_chain"]
            if config in base["per_chain"]
        }
    return out


# ---------------------------------------------------------------------------------------------- command


def provenance() -> dict[str, Any]:
    """Where and when a result was made: the checked-out commit, the date, the machine."""
    from faithproxy.benchmarks.evaluation.shapesworld_bench import git_commit

    return {
        "commit": git_commit(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.node()}, 2 shared CPU cores, no GPU",
    }


def _seed_count(text: str) -> tuple[int, int]:
    seed, _, n = text.partition(":")
    return int(seed), int(n)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.evaluation.flywheel_loop", description=__doc__
    )
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("images")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("truth")
    p.add_argument("--pairs", type=Path, nargs="+", required=True)
    p.add_argument("--seed", type=_seed_count, action="append", required=True, help="SEED:N the pairs came from")
    p.add_argument("--out", type=Path)
    p = sub.add_parser("measure")
    p.add_argument("--name", required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--rows", default="judge:learned")
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, help="default: the frozen options'")
    p = sub.add_parser("vanilla")
    p.add_argument("--name", required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, help="default: the frozen held-out seed")
    p.add_argument("--n", type=int, help="default: the frozen options'")
    p.add_argument("--replies", type=Path, help="replies `generate` wrote (else generated here, on the CPU)")
    p = sub.add_parser("generate")
    p.add_argument("--model", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--seed", type=int, help="default: the frozen held-out seed")
    p.add_argument("--n", type=int, help="default: the frozen options'")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--per-model", action="store_true", help="one file per model: OUT's stem, '-', the model's name")
    p = sub.add_parser("compare")
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    command = "python -m faithproxy.benchmarks.evaluation.flywheel_loop " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    if args.what == "images":
        if args.seed not in DEVELOPMENT_SEEDS:
            raise SystemExit(f"pairs come from development seeds only ({DEVELOPMENT_SEEDS})")
        print(write_images(args.seed, args.n, args.out), "images in", args.out)
    elif args.what == "truth":
        pairs = [row for path in args.pairs for row in read_jsonl(path)]
        report = pair_truth(pairs, args.seed) | {"command": command} | provenance()
        print(json.dumps(report, indent=2))
        if args.out:
            args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    elif args.what == "measure":
        frozen = frozen_options()
        n = args.n or frozen["heldout"]["n"]
        rows = [r for r in args.rows.split(",") if r]
        result = measure(args.name, args.model, rows, args.workdir, n, frozen["heldout"]["seed"])
        result["command"] = command
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(json.dumps(result["figures"], indent=1))
    elif args.what == "vanilla":
        frozen = frozen_options()
        seed = frozen["heldout"]["seed"] if args.seed is None else args.seed
        generated = json.loads(args.replies.read_text(encoding="utf-8")) if args.replies else None
        n = args.n or frozen["heldout"]["n"]
        result = vanilla_transformers(args.name, args.model, n, seed, generated=generated)
        result["command"] = command
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(json.dumps(result["figures"], indent=1))
    elif args.what == "generate":
        frozen = frozen_options()
        seed = frozen["heldout"]["seed"] if args.seed is None else args.seed
        models = {name: Path(folder) for name, _, folder in (m.partition("=") for m in args.model)}
        generated = generate(models, seed, args.n or frozen["heldout"]["n"], args.device) | {"command": command}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.per_model:  # so that a reader opens only the models it is meant to see
            for name, one in generated["replies"].items():
                path = args.out.with_name(f"{args.out.stem}-{name}{args.out.suffix}")
                path.write_text(json.dumps(generated | {"replies": {name: one}}) + "\n", encoding="utf-8")
        else:
            args.out.write_text(json.dumps(generated) + "\n", encoding="utf-8")
        print({name: g["wall_s"] for name, g in generated["replies"].items()})
    else:
        results = [json.loads(path.read_text(encoding="utf-8")) for path in args.results]
        out = compare(results) | {"command": command, "sources": [str(p) for p in args.results]} | provenance()
        args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
