"""The generator's own probability of each perception step, as a signal of a false step (no samples).

    python -m faithproxy.benchmarks.evaluation.likelihood_signal --seed 997 --n 100 \
        --out benchmarks/results/consistency/likelihood-997.json

Development seeds only. The limit of the consistency detector's reading as its samples grow is the
probability the model gives the sentence it wrote; vLLM returns it for free with a prefill
(`prompt_logprobs`). For every perception sentence of the greedy chains, two prefill requests (the chain
up to the sentence's end, and up to its start) give the log-probabilities of the sentence's own tokens;
the readings are their sum, their minimum and their mean, each turned into a score (higher: more
likely false) and scored by AUROC and by precision at set recalls against ground truth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.evaluation.consistency_signal import auroc, perception_sentences
from faithproxy.benchmarks.evaluation.provenance import load_now, run_record
from faithproxy.benchmarks.evaluation.shapesworld_bench import DEV_MODE, VLLM_START_S, _body
from faithproxy.benchmarks.evaluation.shapesworld_rows import step_type
from faithproxy.benchmarks.shapesworld.dataset import Item
from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
from faithproxy.benchmarks.shapesworld.model.evaluate import SERVED_NAME
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items

READINGS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda lps: -sum(lps),
    "min": lambda lps: -min(lps),
    "mean": lambda lps: -sum(lps) / len(lps),
}


async def _prompt_logprobs(http: httpx.AsyncClient, item: Item, text: str) -> list[float]:
    body = _body(item) | {
        "messages": [*_body(item)["messages"], {"role": "assistant", "content": text}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": 1,
        "prompt_logprobs": 0,  # the prompt tokens' own log-probabilities
    }
    reply = await http.post("/v1/chat/completions", json=body)
    reply.raise_for_status()
    # one entry per prompt token (None for the first): {token id: {"logprob": ...}}, the token's own only
    return [next(iter(e.values()))["logprob"] if e else 0.0 for e in reply.json()["prompt_logprobs"]]


async def collect(base_url: str, items: Sequence[Item], concurrency: int) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)
    steps: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:

        async def chain(item: Item) -> None:
            async with gate:
                reply = await http.post("/v1/chat/completions", json=_body(item))
                reply.raise_for_status()
            text = reply.json()["choices"][0]["message"]["content"] or ""
            for i, sentence, at, cursor, check in perception_sentences(item, text):
                async with gate:
                    upto = await _prompt_logprobs(http, item, text[:cursor])
                    before = await _prompt_logprobs(http, item, text[:at].rstrip())
                own = upto[len(before) :]
                steps.append({"item": item.id, "index": i, "text": sentence, "type": step_type(check.claim),
                              "faithful": check.faithful, "logprobs": [round(x, 5) for x in own]})  # fmt: skip

        await asyncio.gather(*(chain(i) for i in items))
    return steps


def curve(scores: list[float], false: list[bool]) -> list[dict[str, Any]]:
    """Precision and recall of flagging the top-scored steps, at recalls 0.4 to 0.8."""
    ranked = sorted(zip(scores, false, strict=True), key=lambda p: -p[0])
    total, tp, out, targets = sum(false), 0, [], [0.4, 0.5, 0.6, 0.7, 0.8]
    for n, (score, y) in enumerate(ranked, 1):
        tp += y
        while targets and tp / total >= targets[0]:
            out.append(
                {"recall": targets.pop(0), "flags": n, "precision": round(tp / n, 4), "at_score": round(score, 4)}
            )
    return out


def main() -> None:
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--seed", type=int, default=997, choices=(997, 999), help="a development seed")
    cli.add_argument("--n", type=int, default=100)
    cli.add_argument("--concurrency", type=int, default=8)
    cli.add_argument("--out", type=Path, required=True)
    args = cli.parse_args()
    started, load = time.time(), load_now()
    with start_vllm(WEIGHTS_DIR, served_model_name=SERVED_NAME, env=DEV_MODE, health_timeout=VLLM_START_S) as vllm:
        steps = asyncio.run(collect(vllm.base_url, heldout_items(args.n, args.seed), args.concurrency))
    steps = [s for s in steps if s["logprobs"]]
    false = [not s["faithful"] for s in steps]
    readings = {}
    for name, read in READINGS.items():
        scores = [read(s["logprobs"]) for s in steps]
        readings[name] = {"auroc": auroc(scores, false), "curve": curve(scores, false)}
    result = {
        "command": f"python -m faithproxy.benchmarks.evaluation.likelihood_signal --seed {args.seed} --n {args.n} "
        f"--out {args.out}",
        **run_record(started, load),
        "seed": args.seed,
        "chains": args.n,
        "steps_scored": len(steps),
        "false_steps": sum(false),
        "readings": readings,
        "wall_s": round(time.time() - started, 1),
        "steps": steps,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(readings, indent=1))


if __name__ == "__main__":
    main()
