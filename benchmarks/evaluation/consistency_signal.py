"""How well the generator's own samples tell its false perception sentences from its true ones.

    python -m faithproxy.benchmarks.evaluation.consistency_signal --seed 997 --n 100 --k 8 \
        --out benchmarks/results/consistency-signal-997.json

Development seeds only (997, 999): the numbers here choose the consistency detector's comparison and
threshold. For every perception sentence of the generator's greedy chains, k continuations are sampled
from the chain text that ends just before it (one vLLM request with `n = k`, as the detector asks), cut
into sentences and parsed with the world's grammar. Two readings of the samples per sentence:

- `next`: the share of samples whose FIRST sentence makes the same claim (the step's own position);
- `support`: the share of samples in which ANY sentence makes the same claim (SelfCheckGPT's reading:
  a model that lists the objects in another order still names the same objects).

`1 - support` (and `1 - next`) is a P(unfaithful)-like score; its precision and recall against ground
truth are given per step type (count, absence, object in cell, object, relation) at a grid of thresholds,
with its AUROC. The generator runs in a vLLM started here; nothing else runs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.evaluation.provenance import load_now, run_record
from faithproxy.benchmarks.evaluation.shapesworld_bench import DEV_MODE, VLLM_START_S, _body
from faithproxy.benchmarks.evaluation.shapesworld_rows import step_type
from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, SentenceCheck, check_sentence
from faithproxy.benchmarks.shapesworld.dataset import Item
from faithproxy.benchmarks.shapesworld.language import parse_claim
from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
from faithproxy.benchmarks.shapesworld.model.evaluate import SERVED_NAME
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items, reply_sentences

THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


async def _sample(http: httpx.AsyncClient, item: Item, prefix: str, k: int, max_tokens: int) -> dict:
    body = _body(item) | {
        "messages": [*_body(item)["messages"], {"role": "assistant", "content": prefix}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "temperature": 1.0,
        "n": k,
        "max_tokens": max_tokens,
    }
    reply = await http.post("/chat/completions", json=body)
    reply.raise_for_status()
    return reply.json()


def _claims(text: str) -> list[Any]:
    return [parse_claim(s) for s in reply_sentences(text) if check_sentence(s, ()).kind == PERCEPTION]


def perception_sentences(item: Item, text: str) -> Iterator[tuple[int, str, int, int, SentenceCheck]]:
    """(index, sentence, start, end, ground truth) of each perception sentence of a reply, `start` and
    `end` its place in `text`: the chain before it is `text[:start]`."""
    cursor = 0
    for i, sentence in enumerate(reply_sentences(text)):
        start = text.index(sentence, cursor)
        cursor = start + len(sentence)
        check = check_sentence(sentence, item.scene.objects)
        if check.kind == PERCEPTION and check.claim is not None:
            yield i, sentence, start, cursor, check


async def collect(base_url: str, items: Sequence[Item], k: int, max_tokens: int, concurrency: int) -> list[dict]:
    gate = asyncio.Semaphore(concurrency)
    steps: list[dict] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:

        async def chain(item: Item) -> None:
            async with gate:
                reply = await http.post("/chat/completions", json=_body(item))
                reply.raise_for_status()
            text = reply.json()["choices"][0]["message"]["content"] or ""
            for i, sentence, at, _, check in perception_sentences(item, text):
                async with gate:
                    started = time.perf_counter()
                    out = await _sample(http, item, text[:at].rstrip(), k, max_tokens)
                    wall = time.perf_counter() - started
                samples = [c["message"]["content"] or "" for c in out["choices"]]
                parsed = [_claims(s) for s in samples]
                steps.append(
                    {
                        "item": item.id,
                        "index": i,
                        "text": sentence,
                        "type": step_type(check.claim),
                        "faithful": check.faithful,
                        "next": sum(bool(p) and p[0] == check.claim for p in parsed) / k,
                        "support": sum(check.claim in p for p in parsed) / k,
                        "parsed": sum(bool(p) for p in parsed) / k,
                        "completion_tokens": out["usage"]["completion_tokens"],
                        "wall_s": round(wall, 3),
                    }
                )

        await asyncio.gather(*(chain(i) for i in items))
    return steps


def auroc(scores: Sequence[float], positives: Sequence[bool]) -> float | None:
    """P(score of a random false sentence > score of a random true one), ties counting half."""
    pos = [s for s, p in zip(scores, positives, strict=True) if p]
    neg = [s for s, p in zip(scores, positives, strict=True) if not p]
    if not pos or not neg:
        return None
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    return round(wins / (len(pos) * len(neg)), 4)


def table(steps: Sequence[dict], reading: str) -> dict[str, Any]:
    """Precision and recall of `1 - reading` >= t on the false sentences, per step type and overall."""
    out: dict[str, Any] = {}
    groups = {"all": list(steps)}
    for s in steps:
        groups.setdefault(s["type"], []).append(s)
    for name, group in sorted(groups.items()):
        false = [not s["faithful"] for s in group]
        scores = [1 - s[reading] for s in group]
        rows = {}
        for t in THRESHOLDS:
            flagged = [x >= t for x in scores]
            tp = sum(f and y for f, y in zip(flagged, false, strict=True))
            rows[str(t)] = {
                "flags": sum(flagged),
                "true_flags": tp,
                "precision": round(tp / sum(flagged), 4) if sum(flagged) else None,
                "recall": round(tp / sum(false), 4) if sum(false) else None,
            }
        out[name] = {"steps": len(group), "false": sum(false), "auroc": auroc(scores, false), "thresholds": rows}
    return out


def main() -> None:
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--seed", type=int, default=997, choices=(997, 999), help="a development seed")
    cli.add_argument("--n", type=int, default=100)
    cli.add_argument("--k", type=int, default=8)
    cli.add_argument("--max-tokens", type=int, default=64, help="per sample: a few sentences")
    cli.add_argument("--concurrency", type=int, default=8)
    cli.add_argument("--model", type=Path, default=WEIGHTS_DIR)
    cli.add_argument("--out", type=Path, required=True)
    args = cli.parse_args()
    items = heldout_items(args.n, args.seed)
    started, load = time.time(), load_now()
    with start_vllm(args.model, served_model_name=SERVED_NAME, env=DEV_MODE, health_timeout=VLLM_START_S) as vllm:
        steps = asyncio.run(collect(f"{vllm.base_url}/v1", items, args.k, args.max_tokens, args.concurrency))
    result = {
        "command": "python -m faithproxy.benchmarks.evaluation.consistency_signal "
        f"--seed {args.seed} --n {args.n} --k {args.k} --max-tokens {args.max_tokens} --out {args.out}",
        **run_record(started, load),
        "seed": args.seed,
        "chains": args.n,
        "k": args.k,
        "max_tokens": args.max_tokens,
        "wall_s": round(time.time() - started, 1),
        "by_reading": {"support": table(steps, "support"), "next": table(steps, "next")},
        "steps": steps,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for reading in ("support", "next"):
        a = result["by_reading"][reading]
        print(reading, {name: (g["steps"], g["false"], g["auroc"]) for name, g in a.items()})
        for t, r in a["all"]["thresholds"].items():
            print(f"  t={t}: {r}")


if __name__ == "__main__":
    main()
