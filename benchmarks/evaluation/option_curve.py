"""Collects the data of FREAK's reasoning-drift curve: P(each option) after each step, from vLLM logprobs.

For a multiple-choice chain of n steps, n + 1 requests ask the generator to answer right after the
first k steps (k = 0..n): the assistant message is the chain's first k steps followed by an answer
prefix ("So the answer is (" by default), continued with `continue_final_message` for one token, with
`top_logprobs`. The log-probabilities of the option letters among the top tokens (" B" and "B" alike;
the best of them per letter) form entry k of the record that `benchmarks/evaluation/report.py` plots:

    {"id", "gold_answer", "distractor" (when the chain has one), "option_logprobs": [{"A": -2.1, ...}, ...]}

The answer prefix must end where the model's own text would end before the letter: with "(" or with
the word before it, never with a space (" B" is one token for most tokenizers; a prefix ending in a
space forces the letter into a tokenization the model never saw, and every letter looks unlikely).

A letter outside the top tokens is left out of its entry (its probability is taken as 0 when the
entry is renormalised). A failed request leaves its entry empty and is counted; it never stops the
collection. vLLM serves this on CPU and GPU alike (`logprobs`, `top_logprobs`, `continue_final_message`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.labelled import LabelledChain
from faithproxy.benchmarks.evaluation.replay import ImageResolver
from faithproxy.faithcore.errors import UpstreamError

DEFAULT_ANSWER_PREFIX = "\nSo the answer is ("


@dataclass(frozen=True)
class CurveSettings:
    model: str
    options: str = "ABCD"
    answer_prefix: str = DEFAULT_ANSWER_PREFIX
    think_open: str = ""  # e.g. "<think>\n" for models that reason inside think tags
    top_logprobs: int = 20


def partial_answer(steps: Sequence[str], k: int, settings: CurveSettings) -> str:
    """The assistant's partial message after k steps, ending where the option letter comes next."""
    return settings.think_open + " ".join(steps[:k]) + settings.answer_prefix


def letter_logprobs(completion: dict[str, Any], options: str) -> dict[str, float]:
    """Best log-probability per option letter among the first generated token's top alternatives."""
    try:
        first = completion["choices"][0]["logprobs"]["content"][0]
    except (KeyError, IndexError, TypeError):
        return {}
    found: dict[str, float] = {}
    for candidate in [first, *(first.get("top_logprobs") or [])]:
        token = str(candidate.get("token", "")).strip().lstrip("(").strip().upper()
        logprob = candidate.get("logprob")
        if len(token) == 1 and token in options and isinstance(logprob, int | float):
            found[token] = max(found.get(token, float("-inf")), float(logprob))
    return found


def _body(chain: LabelledChain, k: int, settings: CurveSettings, image_url: str | None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": image_url}}] if image_url else []
    content.append({"type": "text", "text": chain.question})
    return {
        "model": settings.model,
        "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": partial_answer([s.text for s in chain.steps], k, settings)},
        ],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": settings.top_logprobs,
    }


async def chain_curve(
    client: Any, chain: LabelledChain, settings: CurveSettings, images: ImageResolver | None = None
) -> tuple[dict[str, Any], int]:
    """(the record for one chain, failed requests). `client` is a clients.vllm.VLLMClient."""
    image = (images or ImageResolver()).resolve(chain.image)
    series: list[dict[str, float]] = []
    failed = 0
    for k in range(len(chain.steps) + 1):
        try:
            completion = await client.chat(_body(chain, k, settings, image.url if image else None))
        except UpstreamError:
            failed += 1
            series.append({})
            continue
        series.append(letter_logprobs(completion, settings.options))
    record: dict[str, Any] = {"id": chain.id, "gold_answer": chain.gold_answer, "option_logprobs": series}
    if isinstance(chain.extra.get("distractor"), str):
        record["distractor"] = chain.extra["distractor"]
    return record, failed


async def collect(
    client: Any,
    chains: Sequence[LabelledChain],
    settings: CurveSettings,
    *,
    image_dir: str | Path | None = None,
    concurrency: int = 4,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], int]:
    """Records for every chain with a gold answer (same order), and the number of failed requests."""
    from tqdm.auto import tqdm

    images = ImageResolver(image_dir)
    wanted = [c for c in chains if c.gold_answer]
    gate = asyncio.Semaphore(max(1, concurrency))
    bar = tqdm(total=len(wanted), desc="option curve", unit="chain", disable=not progress, leave=False)

    async def one(chain: LabelledChain) -> tuple[dict[str, Any], int]:
        async with gate:
            result = await chain_curve(client, chain, settings, images)
        bar.update(1)
        return result

    try:
        results = await asyncio.gather(*(one(c) for c in wanted))
    finally:
        bar.close()
    return [r for r, _ in results], sum(f for _, f in results)
