"""A reproducible stream of (scene, question, chain) items, and a command line that writes them.

Item i of a seed is a pure function of (seed, i, size, qtypes, hallucination_rate): question types
cycle so that every type is equally frequent, and each item has its own random stream, so item 500 is
the same whether 10 or 10,000 items are generated.

    python3 -m faithproxy.benchmarks.shapesworld.dataset --seed 0 --count 1000 --out var/sw/chains.jsonl \\
        --images var/sw/images --hallucination-rate 0.3 --examples var/sw/examples.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from faithproxy.benchmarks.shapesworld.chains import Chain, Hallucination, hallucinated_chain, reference_chain
from faithproxy.benchmarks.shapesworld.examples import TextExample, regeneration_example, self_check_examples
from faithproxy.benchmarks.shapesworld.export import image_filename, image_sha256, write_chains_jsonl
from faithproxy.benchmarks.shapesworld.questions import QTYPES, NoQuestionError, Question, join_existence, make_question
from faithproxy.benchmarks.shapesworld.scenes import DEFAULT_SIZE, Scene, generate_scene

# Whether existence options are written as one word each ("red-square"); the language of the
# committed model's questions. Its run trained on the two-word options up to `--joined-from`.
JOINED_EXISTENCE = True


@dataclass(frozen=True)
class Item:
    id: str
    scene: Scene
    question: Question
    chain: Chain  # the hallucinated chain when `hallucination` is set, else the reference chain
    hallucination: Hallucination | None


def generate_items(
    seed: int,
    count: int,
    *,
    size: int = DEFAULT_SIZE,
    qtypes: Sequence[str] = QTYPES,
    hallucination_rate: float = 0.0,
    start: int = 0,
    joined: bool = JOINED_EXISTENCE,
) -> Iterator[Item]:
    """Items `start` .. `start + count - 1` of `seed`; `joined`: existence options as one word each
    (`questions.join_existence`), which changes their text and nothing else."""
    for i in range(start, start + count):
        rng = random.Random(f"shapesworld-item:{seed}:{i}")
        scene = generate_scene(seed, i, width=size)
        qtype, question = _question(scene, rng, qtypes, i)
        if joined:
            question = join_existence(question)
        hallucination = hallucinated_chain(scene, question, rng) if rng.random() < hallucination_rate else None
        chain = hallucination.chain if hallucination is not None else reference_chain(scene, question)
        yield Item(f"sw-{seed}-{i}-{qtype}", scene, question, chain, hallucination)


def _question(scene: Scene, rng: random.Random, qtypes: Sequence[str], i: int) -> tuple[str, Question]:
    """Item i asks the i-th type of the cycle; in the rare scene where that type has no question with a
    single answer (about 1 in 20,000), the next type that has one. Items that do get their own type are
    exactly what they were before this fallback existed."""
    for k in range(len(qtypes)):
        qtype = qtypes[(i + k) % len(qtypes)]
        try:
            return qtype, make_question(scene, rng, qtype)
        except NoQuestionError:
            continue
    raise NoQuestionError(f"no question of any type {tuple(qtypes)} fits scene {scene.seed}/{scene.index}")


def item_examples(item: Item) -> list[TextExample]:
    """Regeneration example for a hallucinated item; a self-check pair for the item's faithful prefix."""
    rng = random.Random(f"shapesworld-examples:{item.id}")
    examples = self_check_examples(item.scene, item.question, item.chain, rng)
    if item.hallucination is not None:
        examples.append(regeneration_example(item.question, item.hallucination))
    return examples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write ShapesWorld labelled chains (and training examples).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE)
    parser.add_argument("--hallucination-rate", type=float, default=0.0)
    parser.add_argument("--out", type=Path, required=True, help="labelled-chain JSONL")
    parser.add_argument("--images", type=Path, help="folder for PNGs (else records hold PNG hashes)")
    parser.add_argument("--examples", type=Path, help="JSONL of regeneration and self-check examples")
    args = parser.parse_args(argv)
    items = list(
        generate_items(
            args.seed, args.count, size=args.size, hallucination_rate=args.hallucination_rate, start=args.start
        )
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    written = write_chains_jsonl(args.out, ((i.id, i.scene, i.question, i.chain) for i in items), args.images)
    print(f"wrote {written} chains to {args.out}")
    if args.examples is not None:
        args.examples.parent.mkdir(parents=True, exist_ok=True)
        n = 0
        with args.examples.open("w", encoding="utf-8") as out:
            for item in items:
                image = str(args.images / image_filename(item.scene)) if args.images else image_sha256(item.scene)
                for example in item_examples(item):
                    record = {
                        "id": f"{item.id}-{example.task}-{n}",
                        "task": example.task,
                        "image": image,
                        "prompt": example.prompt,
                        "target": example.target,
                    }
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                    n += 1
        print(f"wrote {n} examples to {args.examples}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
