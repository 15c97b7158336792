"""The step typer's labelled chains, from three sources, as `LabelledChain`s with each step's kind.

- `hand`: the hand-written chains of `typer_chains/` (format and labelling rules in its README), split
  `tune` / `heldout`;
- `shapesworld`: chains of the ShapesWorld generator, whose kinds are ground truth by construction;
  world seed 0 (the one the tests use) for tuning, seed `SHAPESWORLD_HELDOUT_SEED` held out;
- `fixture`: the fixture model's chains (benchmarks/tinyvlm/fixture_spec.py), every variant the model is trained on.

Every chain's steps are what the proxy's segmenter cuts from the chain's text: `load_hand` refuses a
chain whose written sentences the segmenter would cut differently, so the typer is scored on real steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from faithproxy.benchmarks.evaluation.labelled import PERCEPTION, REASONING, LabelledChain, LabelledStep
from faithproxy.faithcore.segmenter import segment_text

CHAINS_DIR = Path(__file__).with_name("typer_chains")
SPLITS = ("tune", "heldout")
SHAPESWORLD_HELDOUT_SEED = 7
_KINDS = {"P": PERCEPTION, "R": REASONING}
_HEADER = re.compile(r"^=== (?P<id>\S+)(?P<fields>(?: \| \w[\w-]*=\S+)*)\s*$")
# A sentence that opens a list item or heading, or one after a line ending in a colon or bold text,
# starts on a new line, as a model writes it.
_OWN_LINE = re.compile(r"^(?:[-*+\u2022]|\d{1,3}[.)]|#{1,6})\s")


class TyperDataError(ValueError):
    """A chains file that does not follow the format, or a chain the segmenter would cut differently."""


def chain_text(sentences: list[str], breaks: set[int]) -> str:
    """The text a model would have written: sentences joined by a space, a blank line before each index
    in `breaks`, a newline before list items and after a line ending in a colon or bold text."""
    parts: list[str] = []
    for i, sentence in enumerate(sentences):
        if i:
            if i in breaks:
                parts.append("\n\n")
            elif _OWN_LINE.match(sentence) or parts[-1].endswith((":", "**")):
                parts.append("\n")
            else:
                parts.append(" ")
        parts.append(sentence)
    return "".join(parts)


def _finish(path: Path, record: dict, sentences: list[str], kinds: list[str], breaks: set[int]) -> LabelledChain:
    text = chain_text(sentences, breaks)
    cut = [s.text for s in segment_text(text) if s.text]
    if cut != sentences:
        first = next((i for i, (a, b) in enumerate(zip(cut, sentences, strict=False)) if a != b), len(cut))
        raise TyperDataError(
            f"{path.name}: chain {record['id']}: the segmenter cuts sentence {first + 1} differently: "
            f"{cut[first : first + 1]} vs {sentences[first : first + 1]}"
        )
    steps = [LabelledStep(text=s, kind=k) for s, k in zip(sentences, kinds, strict=True)]
    return LabelledChain(id=record["id"], question=record["question"], steps=steps, extra=record["extra"])


def load_hand(split: str, directory: Path = CHAINS_DIR) -> list[LabelledChain]:
    """The hand-written chains of one split (`tune` or `heldout`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}")
    path = directory / f"{split}.txt"
    chains: list[LabelledChain] = []
    record: dict | None = None
    sentences: list[str] = []
    kinds: list[str] = []
    breaks: set[int] = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        if header := _HEADER.match(line):
            if record is not None:
                chains.append(_finish(path, record, sentences, kinds, breaks))
            fields = dict(f.split("=", 1) for f in header.group("fields").split(" | ")[1:])
            record = {"id": header.group("id"), "question": "", "extra": {"source": "hand", "split": split, **fields}}
            sentences, kinds, breaks = [], [], set()
        elif record is None:
            raise TyperDataError(f"{path.name}:{number}: text before the first '=== id' header")
        elif line.startswith("Q: "):
            record["question"] = line[3:]
        elif line == "~":
            breaks.add(len(sentences))
        elif line[:3] in ("P: ", "R: "):
            sentences.append(line[3:])
            kinds.append(_KINDS[line[0]])
        else:
            raise TyperDataError(f"{path.name}:{number}: expected 'Q: ', 'P: ', 'R: ' or '~'")
    if record is not None:
        chains.append(_finish(path, record, sentences, kinds, breaks))
    return chains


def load_shapesworld(split: str, count: int = 200) -> list[LabelledChain]:
    """`count` ShapesWorld chains, reference and hallucinated alike (kinds do not depend on faithfulness);
    the final answer sentence the model writes after the chain is a reasoning step too."""
    from faithproxy.benchmarks.shapesworld.dataset import generate_items

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}")
    seed = 0 if split == "tune" else SHAPESWORLD_HELDOUT_SEED
    chains = []
    for item in generate_items(seed, count, hallucination_rate=0.5):
        steps = [LabelledStep(text=s.text, kind=s.kind) for s in item.chain.steps]
        steps.append(LabelledStep(text=f"The answer is {item.chain.answer}.", kind=REASONING))
        chains.append(
            LabelledChain(
                id=f"sw-{seed}-{len(chains)}", question=item.question.text, steps=steps,
                extra={"source": "shapesworld", "split": split},
            )
        )  # fmt: skip
    return chains


def _fixture_chains() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    from faithproxy.benchmarks.tinyvlm.fixture_spec import FIXTURES, answer_text

    for fixture in FIXTURES:
        answer = (answer_text(fixture.answer), REASONING)
        yield fixture.name, [(s.text, s.kind.value) for s in fixture.chain] + [answer]
        planted = fixture.planted or 0
        for n, rewrite in enumerate(fixture.rewrites):
            head = [(s.text, s.kind.value) for s in fixture.chain[:planted]]
            rest = [(s.text, s.kind.value) for s in (rewrite.sentence, *rewrite.rest)]
            yield f"{fixture.name}-rewrite{n}", head + rest + [(answer_text(rewrite.answer), REASONING)]


def load_fixture() -> list[LabelledChain]:
    """The fixture model's chains and their trained rewrites, with the answer sentence."""
    chains = []
    for name, steps in _fixture_chains():
        labelled = [LabelledStep(text=t, kind=k) for t, k in steps]
        chains.append(LabelledChain(id=f"fixture-{name}", question="", steps=labelled, extra={"source": "fixture"}))
    return chains
