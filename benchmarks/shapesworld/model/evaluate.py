"""Held-out evaluation of a ShapesWorld model through real vLLM, and vLLM/transformers parity.

    python -m faithproxy.benchmarks.shapesworld.model.evaluate --model benchmarks/shapesworld/model/weights \
        --n 150 --out var/sw-eval.json

Runs in two phases so that the two engines never compete for the CPU: first transformers' greedy
`generate` on the first `--parity` held-out chains, one request at a time (`greedy.generate_one`);
then real vLLM (`tinyvlm.serve.start_vllm`, float32) through the openai SDK on all `--n` chains plus
`--aux` regeneration and self-check prompts. Parity requests go to vLLM one at a time as well, so
that no batching difference can enter; the rest run `--concurrency` at a time.

Reports perception error rate against ground truth and accuracy per question type (`scoring`), the
regeneration and self-check success rates, and parity: how many of the compared replies are
identical, with the first differing ones shown.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
from faithproxy.benchmarks.shapesworld.model.corpus import (
    HELDOUT_SEED,
    REGENERATION,
    SELF_CHECK,
    Sample,
    stream,
    user_message,
)
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items, regeneration_ok, self_check_ok, summarise
from faithproxy.benchmarks.shapesworld.scenes import Scene, png_bytes, render
from faithproxy.benchmarks.tinyvlm.processes import supervised

SERVED_NAME = "shapesworld-vlm"


def data_url(scene: Scene) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(render(scene))).decode("ascii")


def transformers_replies(model_dir: Path, samples: list[tuple[str, Scene]], max_new_tokens: int) -> list[str]:
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from faithproxy.benchmarks.shapesworld.model.greedy import generate_one

    torch.set_num_threads(2)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    return [generate_one(model, processor, text, render(scene), max_new_tokens) for text, scene in samples]


def image_dependence(model_dir: Path, n: int = 32) -> dict[str, float]:
    """Teacher-forced chain loss on held-out samples with their own images and with each sample given
    the next one's image: equal losses mean the model ignores the image."""
    import dataclasses
    import itertools

    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from faithproxy.benchmarks.shapesworld.model.corpus import GENERATOR
    from faithproxy.benchmarks.shapesworld.model.train import IGNORE, encode

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    samples = list(itertools.islice(stream(HELDOUT_SEED, GENERATOR), n))
    swapped = [dataclasses.replace(s, scene=samples[(i + 1) % n].scene) for i, s in enumerate(samples)]
    result = {}
    with torch.no_grad():
        for name, batch_samples in (("own_images", samples), ("swapped_images", swapped)):
            batch = encode(processor, batch_samples)
            logits = model(**batch.tensors).logits
            mask = batch.labels != IGNORE
            result[name] = round(torch.nn.functional.cross_entropy(logits[mask], batch.labels[mask]).item(), 5)
    return result


class VLLMClient:
    """Greedy chat completions from a running vLLM server (text of the first choice)."""

    def __init__(self, base_url: str, model: str, max_tokens: int) -> None:
        import openai

        self.client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
        self.model = model
        self.max_tokens = max_tokens

    def reply(self, text: str, scene: Scene, max_tokens: int | None = None) -> str:
        response = self.client.chat.completions.create(
            model=self.model,
            messages=[user_message(text, data_url(scene))],  # type: ignore[list-item]
            temperature=0,
            max_tokens=max_tokens or self.max_tokens,
        )
        return response.choices[0].message.content or ""

    def replies(self, samples: list[tuple[str, Scene]], concurrency: int, max_tokens: int | None = None) -> list[str]:
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(lambda s: self.reply(s[0], s[1], max_tokens), samples))


def parity_report(hf: list[str], vllm: list[str], item_ids: list[str], show: int = 3) -> dict[str, Any]:
    differing = [i for i, (a, b) in enumerate(zip(hf, vllm, strict=True)) if a != b]
    return {
        "compared": len(hf),
        "identical": len(hf) - len(differing),
        "differing": [{"id": item_ids[i], "transformers": hf[i], "vllm": vllm[i]} for i in differing[:show]],
    }


@supervised()  # a signal or a failure stops every server started inside
def evaluate(
    model_dir: Path, n: int, parity: int, aux: int, concurrency: int, max_new_tokens: int, log_path: Path | None
) -> dict[str, Any]:
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    items = heldout_items(n)
    questions = [(i.question.prompt, i.scene) for i in items]
    aux_samples: dict[str, list[Sample]] = {}
    for task in (REGENERATION, SELF_CHECK):
        it = stream(HELDOUT_SEED, task)
        aux_samples[task] = [next(it) for _ in range(aux)]

    started = time.monotonic()
    dependence = image_dependence(model_dir)
    hf = transformers_replies(model_dir, questions[:parity], max_new_tokens) if parity else []
    hf_seconds = time.monotonic() - started
    print(f"transformers: {len(hf)} replies in {hf_seconds:.0f}s", flush=True)

    started = time.monotonic()
    with start_vllm(model_dir, served_model_name=SERVED_NAME, log_path=log_path) as server:
        startup = time.monotonic() - started
        client = VLLMClient(server.openai_base_url, server.model, max_new_tokens)
        first = [client.reply(text, scene) for text, scene in questions[:parity]]
        rest = client.replies(questions[parity:], concurrency)
        regen = client.replies([(s.text, s.scene) for s in aux_samples[REGENERATION]], concurrency, 40)
        checks = client.replies([(s.text, s.scene) for s in aux_samples[SELF_CHECK]], concurrency, 4)
    vllm_seconds = time.monotonic() - started
    print(f"vLLM: ready in {startup:.0f}s, all replies in {vllm_seconds:.0f}s", flush=True)

    vllm_replies = first + rest
    result: dict[str, Any] = {
        "model": str(model_dir),
        "heldout_seed": HELDOUT_SEED,
        "vllm": summarise(items, vllm_replies).to_dict(),
        "parity": parity_report(hf, first, [i.id for i in items[:parity]]),
        "chain_loss": dependence,
        "seconds": {"transformers": round(hf_seconds, 1), "vllm": round(vllm_seconds, 1)},
    }
    if hf:
        result["transformers"] = summarise(items[:parity], hf).to_dict()
        result["vllm_on_parity_subset"] = summarise(items[:parity], first).to_dict()
    result["vllm"]["regeneration_correct"] = round(
        sum(regeneration_ok(s.scene, r) for s, r in zip(aux_samples[REGENERATION], regen, strict=True)) / max(aux, 1), 4
    )
    result["vllm"]["self_check_accuracy"] = round(
        sum(self_check_ok(s.target, r) for s, r in zip(aux_samples[SELF_CHECK], checks, strict=True)) / max(aux, 1),
        4,
    )
    result["examples"] = [{"id": items[i].id, "reply": vllm_replies[i]} for i in range(min(5, n))]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=WEIGHTS_DIR)
    parser.add_argument("--n", type=int, default=150, help="held-out chains (a multiple of 5)")
    parser.add_argument("--parity", type=int, default=50, help="of those, compared with transformers")
    parser.add_argument("--aux", type=int, default=40, help="held-out regeneration and self-check prompts each")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--vllm-log", type=Path)
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.parity > args.n:
        parser.error("--parity cannot exceed --n")
    result = evaluate(args.model, args.n, args.parity, args.aux, args.concurrency, args.max_new_tokens, args.vllm_log)
    result["command"] = "python -m faithproxy.benchmarks.shapesworld.model.evaluate " + (
        " ".join(sys.argv[1:] if argv is None else argv)
    )
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    summary = {k: result[k] for k in ("vllm", "parity") if k in result}
    summary["parity"] = {k: v for k, v in result["parity"].items() if k != "differing"}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
