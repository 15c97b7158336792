"""The deterministic judge's verdict, written in the shape of the paper's detector reply (Table 15).

    The image shows 2 objects: a large red circle in the top left and a small blue square in the centre.
    Sentence 1: PERCEPTION
    Sentence 2: REASONING
    [Faithfulness]: UNFAITHFUL
    [Faithful reasoning chain prefix]: There are 2 objects in the image.
    [First unfaithful sentence]: There is a large green circle in the top left.

The description comes first because the paper's judge grounds itself before typing sentences. Every
sentence is typed, including those after the first unfaithful one. Prefix sentences are joined by one
space, and any line breaks inside a sentence become spaces so that each field is one line. Empty
fields end right after the colon (no trailing space). The lead's judge detector parses
exactly this text, so keep it byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence

from faithproxy.benchmarks.shapesworld.claims import ChainCheck, check_chain
from faithproxy.benchmarks.shapesworld.parser import ImageInput, ParsedScene, parse_image
from faithproxy.benchmarks.shapesworld.world import Ref


def describe(scene: ParsedScene) -> str:
    """'The image shows 2 objects: a large red circle in the top left and a small blue square ...'"""
    phrases = [Ref.of(o).with_article() for o in scene.objects]
    if not phrases:
        return "The image shows no objects."
    if len(phrases) == 1:
        return f"The image shows 1 object: {phrases[0]}."
    listed = ", ".join(phrases[:-1]) + " and " + phrases[-1]
    return f"The image shows {len(phrases)} objects: {listed}."


def format_judge_reply(description: str, check: ChainCheck) -> str:
    lines = [description]
    lines += [f"Sentence {k}: {s.kind.upper()}" for k, s in enumerate(check.sentences, start=1)]
    first = "" if check.first_unfaithful is None else check.sentences[check.first_unfaithful].text
    lines += [
        _field("Faithfulness", "FAITHFUL" if check.faithful else "UNFAITHFUL"),
        _field("Faithful reasoning chain prefix", " ".join(check.prefix)),
        _field("First unfaithful sentence", first),
    ]
    return "\n".join(lines)


def _field(name: str, value: str) -> str:
    value = " ".join(value.split())  # one line per field, whatever whitespace the sentences carried
    return f"[{name}]: {value}" if value else f"[{name}]:"


def judge_reply(image: ImageInput, sentences: Sequence[str]) -> str:
    """Parse the image, check the (partial) chain against it, and write the reply."""
    scene = parse_image(image)
    return format_judge_reply(describe(scene), check_chain(sentences, scene.objects))
