"""ShapesWorld end to end: held-out scenes through real vLLM, vanilla against faithproxy per detector.

    python -m faithproxy.benchmarks.evaluation.shapesworld_bench --n 100 --detectors judge,prompt \
        --out benchmarks/results/shapesworld.json
    faithproxy bench shapesworld --n 100 --detectors judge,prompt --out benchmarks/results/shapesworld.json

Everything is real except the judge's eyes: vLLM serves the committed ShapesWorld model (float32, see
`tinyvlm.serve`), faithproxy runs in this process in front of it, and the `judge` detector talks to
the pixel judge (`benchmarks.judge_server --shapesworld`) over the Anthropic Messages API through the
anthropic SDK. Every chain is scored against the scene's ground truth (`shapesworld.claims` on the true
objects, not on what a judge said):

- upr_vanilla: false perception sentences / perception sentences of the chains vLLM writes alone;
- upr_first_draft (per detector): the same for the steps as the generator first wrote them inside the
  proxy (before any correction), and upr_detected: the share of those the detector flagged;
- upr_residual: the same ratio over the chains faithproxy returns (after correction);
- accuracy vanilla and corrected; the detector's precision/recall/F1 against ground truth on the
  first drafts; regeneration outcomes by attempt (Table 12 style: fixed at try k, or kept residual,
  and whether the accepted fix is true by ground truth); wall time per configuration.

Labelled chains (the `benchmarks/evaluation/labelled.py` format, ground-truth verdicts per step) are written for
the vanilla chains and for each detector's corrected chains (`--labelled-dir`), for training and scoring
detectors. Questions cycle through the five types, so `--n` should be a multiple of 5.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.standins.judge_server import PixelJudge, running_judge_server
from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.local_server import running_app
from faithproxy.shapesworld.claims import PERCEPTION, check_sentence
from faithproxy.shapesworld.dataset import Item
from faithproxy.shapesworld.export import image_sha256
from faithproxy.shapesworld.model import WEIGHTS_DIR
from faithproxy.shapesworld.model.corpus import HELDOUT_SEED, MIN_TRAINING_SEED, VALIDATION_SEED, user_message
from faithproxy.shapesworld.model.evaluate import SERVED_NAME, data_url
from faithproxy.shapesworld.model.scoring import ReplyScore, heldout_items, reply_sentences, score_reply
from faithproxy.tinyvlm.processes import supervised

MAX_TOKENS = 160


# ------------------------------------------------------------------------------------------- requests


async def vanilla_replies(base_url: str, items: Sequence[Item], concurrency: int) -> list[str]:
    """Greedy chains straight from vLLM (`base_url` is vLLM's /v1)."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:

        async def one(item: Item) -> str:
            async with gate:
                body = _body(item)
                reply = await http.post("/chat/completions", json=body)
                reply.raise_for_status()
                return reply.json()["choices"][0]["message"]["content"] or ""

        return list(await asyncio.gather(*(one(i) for i in items)))


async def proxy_replies(
    base_url: str, items: Sequence[Item], detector: str, concurrency: int
) -> list[tuple[str, str, dict[str, Any]]]:
    """(content, request id, faithfulness summary) per item, through faithproxy in correct mode."""
    gate = asyncio.Semaphore(concurrency)
    headers = {"x-faithproxy-mode": "correct", "x-faithproxy-detector": detector}
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers=headers) as http:

        async def one(item: Item) -> tuple[str, str, dict[str, Any]]:
            async with gate:
                reply = await http.post("/v1/chat/completions", json=_body(item))
                if reply.status_code != 200:
                    raise RuntimeError(f"{item.id}: faithproxy answered {reply.status_code}: {reply.text[:300]}")
                data = reply.json()
                content = data["choices"][0]["message"]["content"] or ""
                return content, reply.headers["x-faithproxy-request-id"], data.get("faithfulness") or {}

        return list(await asyncio.gather(*(one(i) for i in items)))


def _body(item: Item) -> dict[str, Any]:
    return {
        "model": SERVED_NAME,
        "messages": [user_message(item.question.prompt, data_url(item.scene))],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    }


# -------------------------------------------------------------------------------------------- scoring


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
        "regeneration_outcomes": dict(sorted(outcomes.items())),
        "accepted_fixes_true_by_ground_truth": ratio(fixes_true, fixes),
    }


def labelled_record(item: Item, reply: str, record_id: str) -> dict[str, Any]:
    """One chain in the labelled format, with ground-truth verdicts per step."""
    steps = []
    for sentence in reply_sentences(reply):
        check = check_sentence(sentence, item.scene.objects)
        kind = "perception" if check.kind == PERCEPTION else "reasoning"
        steps.append({"text": sentence, "kind": kind, "faithful": check.faithful if kind == "perception" else None})
    answer = score_reply(item, reply).answer
    return {
        "id": record_id,
        "question": item.question.prompt,
        "image": image_sha256(item.scene),
        "steps": steps,
        "answer": answer,
        "gold_answer": item.question.gold_letter,
    }


def write_labelled(path: Path, records: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def read_traces(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    return {r["id"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if r.get("id")}


# --------------------------------------------------------------------------------------------- report


def markdown(result: dict[str, Any]) -> str:
    v = result["vanilla"]
    lines = [
        f"# ShapesWorld: vanilla vs faithproxy ({result['n_chains']} held-out chains)",
        "",
        "UPR and accuracy by ground truth (Table 11 style):",
        "",
        "| configuration | UPR first draft | UPR detected | UPR residual | accuracy | right option text | wall s |",
        "|---|---|---|---|---|---|---|",
        f"| vanilla (vLLM alone) | {v['upr']:.3f} | – | {v['upr']:.3f} | {v['accuracy']:.3f} | "
        f"{v['option_text_correct']:.3f} | {v['wall_s']:.1f} |",
    ]
    for name, d in result["detectors"].items():
        c = d["corrected"]
        lines.append(
            f"| faithproxy, {name} | {d['upr_first_draft']:.3f} | {d['upr_detected']:.3f} | {c['upr']:.3f} | "
            f"{c['accuracy']:.3f} | {c['option_text_correct']:.3f} | {d['wall_s']:.1f} |"
        )
    lines += ["", "Detectors against ground truth on the first drafts (Table 4 style):", ""]
    lines += ["| detector | precision | recall | F1 | flagged share |", "|---|---|---|---|---|"]
    for name, d in result["detectors"].items():
        g = d["detector_vs_ground_truth"]
        lines.append(f"| {name} | {g['precision']:.3f} | {g['recall']:.3f} | {g['f1']:.3f} | {d['upr_detected']:.3f} |")
    lines += ["", "Regeneration outcomes of flagged steps (Table 12 style):", ""]
    for name, d in result["detectors"].items():
        outcomes = ", ".join(f"{k}: {n}" for k, n in d["regeneration_outcomes"].items()) or "none flagged"
        lines.append(f"- {name}: {outcomes}; accepted fixes true by ground truth: "
                     f"{d['accepted_fixes_true_by_ground_truth']:.3f}")  # fmt: skip
    lines += ["", f"Reproduce: `{result['command']}`", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Three panels: UPR by ground truth, accuracy, and regeneration outcomes per detector."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    detectors = result["detectors"]
    names = ["vanilla", *detectors]
    fig, (upr, acc, regen) = plt.subplots(1, 3, figsize=(13, 3.8))
    residual = [result["vanilla"]["upr"], *(d["corrected"]["upr"] for d in detectors.values())]
    drafts = [result["vanilla"]["upr"], *(d["upr_first_draft"] for d in detectors.values())]
    xs = range(len(names))
    upr.bar([x - 0.2 for x in xs], drafts, 0.4, label="first draft")
    upr.bar([x + 0.2 for x in xs], residual, 0.4, label="returned (residual)")
    upr.set_xticks(list(xs), names)
    upr.set_title("UPR by ground truth")
    upr.set_ylim(0, 1.2)
    upr.legend(fontsize=8, loc="upper right")
    acc.bar(names, [result["vanilla"]["accuracy"], *(d["corrected"]["accuracy"] for d in detectors.values())])
    acc.set_ylim(0, 1)
    acc.set_title("answer accuracy")
    keys = sorted({k for d in detectors.values() for k in d["regeneration_outcomes"]})
    width = 0.8 / max(len(detectors), 1)
    for i, (name, d) in enumerate(detectors.items()):
        regen.bar([k + i * width for k in range(len(keys))], [d["regeneration_outcomes"].get(k, 0) for k in keys],
                  width, label=name)  # fmt: skip
    regen.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))], [k.replace("_", " ") for k in keys],
                     rotation=20, fontsize=8)  # fmt: skip
    regen.set_title("flagged steps: outcome")
    regen.legend()
    fig.suptitle(f"ShapesWorld, {result['n_chains']} held-out chains")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ run


async def run_all(
    vllm_url: str,
    items: Sequence[Item],
    detectors: Sequence[str],
    concurrency: int,
    workdir: Path,
    max_retries: int,
    regeneration_samples: int | None = None,
) -> dict[str, Any]:
    from faithproxy.clients.judges import JudgeConfig
    from faithproxy.server.app import create_app
    from faithproxy.server.settings import Settings

    started = time.monotonic()
    vanilla = await vanilla_replies(f"{vllm_url}/v1", items, concurrency)
    result: dict[str, Any] = {"vanilla_replies": vanilla, "vanilla_wall_s": time.monotonic() - started}
    traces_path = workdir / "traces.jsonl"
    traces_path.unlink(missing_ok=True)
    async with running_judge_server(create_judge_app(PixelJudge())) as judge_url:
        judge = JudgeConfig(name="pixels", backend="anthropic", model="shapesworld-pixel-judge", base_url=judge_url,
                            api_key="local", timeout_s=30, max_retries=0)  # fmt: skip
        samples = {} if regeneration_samples is None else {"regeneration_samples": regeneration_samples}
        settings = Settings(upstream_url=vllm_url, judges=[judge], default_judge="pixels", trace_path=str(traces_path),
                            max_retries=max_retries, **samples)  # fmt: skip
        async with running_app(create_app(settings)) as proxy_url:
            for detector in detectors:
                started = time.monotonic()
                result[detector] = {
                    "replies": await proxy_replies(proxy_url, items, detector, concurrency),
                    "wall_s": time.monotonic() - started,
                }
    result["traces"] = read_traces(traces_path)
    return result


@supervised()  # a signal or a failure stops every server started inside
def benchmark(
    model_dir: Path,
    n: int,
    detectors: Sequence[str],
    concurrency: int,
    workdir: Path,
    max_retries: int,
    regeneration_samples: int | None = None,
    seed: int = HELDOUT_SEED,
) -> dict[str, Any]:
    from faithproxy.tinyvlm.serve import start_vllm

    items = heldout_items(n, seed)
    workdir.mkdir(parents=True, exist_ok=True)
    with start_vllm(model_dir, served_model_name=SERVED_NAME, log_path=workdir / "vllm.log") as server:
        raw = asyncio.run(
            run_all(server.base_url, items, detectors, concurrency, workdir, max_retries, regeneration_samples)
        )
    vanilla = chain_scores(items, raw["vanilla_replies"]) | {"wall_s": round(raw["vanilla_wall_s"], 1)}
    from faithproxy.server.settings import Settings

    samples = regeneration_samples or Settings.model_fields["regeneration_samples"].default
    result: dict[str, Any] = {
        "n_chains": len(items),
        "scenes_seed": seed,
        "model": str(model_dir),
        "max_retries": max_retries,
        "regeneration_samples": samples,
        "vanilla": vanilla,
        "detectors": {},
    }
    vanilla_records = [labelled_record(i, r, i.id) for i, r in zip(items, raw["vanilla_replies"], strict=True)]
    labelled = {"vanilla": vanilla_records}
    for detector in detectors:
        replies = raw[detector]["replies"]
        contents = [content for content, _, _ in replies]
        traces = [raw["traces"][request_id] for _, request_id, _ in replies]
        corrected = chain_scores(items, contents)
        result["detectors"][detector] = {
            "corrected": corrected,
            **draft_scores(items, traces),
            "proxy_summary_upr_detected": ratio(
                sum(s.get("unfaithful_detected", 0) for _, _, s in replies),
                sum(s.get("perception_steps", 0) for _, _, s in replies),
            ),
            "regenerations": sum(s.get("regenerations", 0) for _, _, s in replies),
            "wall_s": round(raw[detector]["wall_s"], 1),
            "upr_reduction_vs_vanilla": round(1 - corrected["upr"] / vanilla["upr"], 4) if vanilla["upr"] else 0.0,
        }
        labelled[detector] = [labelled_record(i, c, i.id) for i, c in zip(items, contents, strict=True)]
    best = min(result["detectors"].values(), key=lambda d: d["corrected"]["upr"], default=None)
    result |= {
        "upr_vanilla": vanilla["upr"],
        "upr_residual": best["corrected"]["upr"] if best else None,
        "accuracy_vanilla": vanilla["accuracy"],
        "accuracy_corrected": best["corrected"]["accuracy"] if best else None,
        "perception_error_rate": vanilla["upr"],
    }
    return result | {"labelled": labelled}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=WEIGHTS_DIR, help="ShapesWorld model folder")
    parser.add_argument("--n", type=int, default=100, help="held-out chains (a multiple of 5)")
    parser.add_argument("--detectors", default="judge,prompt", help="comma-separated detector names")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-retries", type=int, default=3, help="K: regeneration tries per unfaithful step")
    parser.add_argument(
        "--regeneration-samples", type=int, help="rewrites sampled per try (the proxy's REGENERATION_SAMPLES)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        help=f"scenes' seed: {HELDOUT_SEED} held out (default), {VALIDATION_SEED} for choosing among checkpoints",
    )
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-shapesworld"), help="logs and traces")
    parser.add_argument("--out", type=Path, help="result JSON (a Markdown report goes next to it)")
    parser.add_argument("--labelled-dir", type=Path, help="write labelled chains (JSONL) per configuration here")


def main(args: argparse.Namespace) -> int:
    """`faithproxy bench shapesworld` (benchmarks/evaluation/cli.py) and
    `python -m faithproxy.benchmarks.evaluation.shapesworld_bench`."""
    if args.n < 1:
        raise SystemExit("--n must be at least 1")
    detectors = [d.strip() for d in args.detectors.split(",") if d.strip()]
    if args.regeneration_samples is not None and args.regeneration_samples < 1:
        raise SystemExit("--regeneration-samples must be at least 1")
    seed = HELDOUT_SEED if args.seed is None else args.seed
    if not 0 <= seed < MIN_TRAINING_SEED:
        raise SystemExit(
            f"--seed must be in 0..{MIN_TRAINING_SEED - 1}: from {MIN_TRAINING_SEED} on, training draws the scenes"
        )
    result = benchmark(
        args.model,
        args.n,
        detectors,
        args.concurrency,
        args.workdir,
        args.max_retries,
        args.regeneration_samples,
        seed,
    )
    labelled = result.pop("labelled")
    result["command"] = "faithproxy bench shapesworld " + " ".join(
        f"--{k.replace('_', '-')} {_shown(v)}" for k, v in vars(args).items() if k in _OPTIONS and v is not None
    )
    if args.labelled_dir is not None:
        for name, records in labelled.items():
            write_labelled(args.labelled_dir / f"shapesworld-{name}.jsonl", records)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        args.out.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
        plot(result, args.out.with_suffix(".png"))
    print(markdown(result))
    return 0


def _shown(value: Any) -> str:
    """Paths relative to the working directory when they are below it, so the command can be rerun."""
    if isinstance(value, Path) and value.resolve().is_relative_to(Path.cwd()):
        return str(value.resolve().relative_to(Path.cwd()))
    return str(value)


_OPTIONS = (
    "model",
    "n",
    "seed",
    "detectors",
    "concurrency",
    "max_retries",
    "regeneration_samples",
    "out",
    "labelled_dir",
)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.evaluation.shapesworld_bench", description=__doc__.split("\n\n")[0]
    )
    add_arguments(cli)
    sys.exit(main(cli.parse_args()))
