"""Does a checkpoint find option letters? Teacher-forced letter accuracy on held-out samples.

    python -m faithproxy.benchmarks.shapesworld.model.letter_lookup var/sw-train/checkpoints/step-006579 --n 40

Two numbers tell the lookup apart from its shortcuts. In reference chains: how often the most likely
letter after "So the answer is <text>" is that option's letter. In the letters drill
(`corpus.LETTERS`): the same, by position in the answer — the first letter named can only come from
the lookup, the last can also be had by elimination. In the lookup drill (`corpus.LOOKUP`), whose options are
drawn with replacement, no position can be had by elimination. Chance is 25%.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from faithproxy.benchmarks.shapesworld.chains import EXISTENCE_STYLES, ONE_STEP
from faithproxy.benchmarks.shapesworld.model.corpus import (
    HELDOUT_SEED,
    Sample,
    generator_sample,
    letters_stream,
    lookup_stream,
)
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items
from faithproxy.benchmarks.shapesworld.model.train import encode, option_letter_ids


def letter_hits(model: Any, processor: Any, samples: Iterable[Sample]) -> list[list[bool]]:
    """Per sample, for each option-letter token of the target in order: is it the argmax?"""
    letters = option_letter_ids(processor.tokenizer)
    out = []
    for sample in samples:
        batch = encode(processor, [sample])
        with torch.no_grad():
            logits = model(**batch.tensors, use_cache=False).logits[0]
        labels = batch.labels[0].tolist()
        out.append([int(logits[i].argmax()) == t for i, t in enumerate(labels) if t in letters])
    return out


def measure(path: Path, n: int, existence: str = ONE_STEP) -> dict[str, Any]:
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(path)
    chains = letter_hits(model, processor, (generator_sample(i, existence=existence) for i in heldout_items(n)))
    drills = letter_hits(model, processor, itertools.islice(letters_stream(HELDOUT_SEED), n))
    lookups = letter_hits(model, processor, itertools.islice(lookup_stream(HELDOUT_SEED), n))
    # a chain's first letter token is an option letter: the answer's, or in a BY_OBJECT existence
    # chain the first object's; the last, after </think>, repeats the answer's
    return {
        "checkpoint": str(path),
        "chains": n,
        "existence": existence,
        "chain_option_letter_right": round(sum(h[0] for h in chains) / n, 4),
        "drill_letter_right_by_position": [round(sum(h[k] for h in drills) / n, 4) for k in range(4)],
        "lookup_letter_right_by_position": [round(sum(h[k] for h in lookups) / n, 4) for k in range(4)],
    }


def checkpoint_cli(
    argv: list[str] | None, doc: str, measure_fn: Callable[[Path, int, str], dict[str, Any]], n: int, n_help: str
) -> int:
    """The command line of a checkpoint diagnostic (this one, `existence_check`): a checkpoint, --n,
    the chains' --existence style and --threads; prints the measurement as one JSON line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--n", type=int, default=n, help=n_help)
    parser.add_argument(
        "--existence", choices=EXISTENCE_STYLES, default=ONE_STEP, help="the chains' existence style (see chains)"
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    torch.set_num_threads(args.threads)
    print(json.dumps(measure_fn(args.checkpoint, args.n, args.existence)))
    return 0


def main(argv: list[str] | None = None) -> int:
    return checkpoint_cli(argv, __doc__ or "", measure, 40, "held-out chains and drills")


if __name__ == "__main__":
    sys.exit(main())
