import random
import re

from faithproxy.benchmarks.shapesworld.chains import hallucinated_chain, reference_chain
from faithproxy.benchmarks.shapesworld.judge_reply import describe, judge_reply
from faithproxy.benchmarks.shapesworld.parser import parse_image
from faithproxy.benchmarks.shapesworld.questions import QTYPES, make_question
from faithproxy.benchmarks.shapesworld.scenes import generate_scene, render

# scene (0, 1): a small yellow triangle in the top middle and a small green square in the top right
CHAIN = [
    "There are 2 objects in the image.",
    "There is a small red triangle in the top middle.",
    "There is a small green square in the top right.",
    "So the yellow object is a triangle.",
    "So the answer is triangle B.",
]


def test_unfaithful_reply_is_exactly_the_table_15_shape():
    assert judge_reply(render(generate_scene(0, 1)), CHAIN) == (
        "The image shows 2 objects: a small yellow triangle in the top middle"
        " and a small green square in the top right.\n"
        "Sentence 1: PERCEPTION\n"
        "Sentence 2: PERCEPTION\n"
        "Sentence 3: PERCEPTION\n"
        "Sentence 4: REASONING\n"
        "Sentence 5: REASONING\n"
        "[Faithfulness]: UNFAITHFUL\n"
        "[Faithful reasoning chain prefix]: There are 2 objects in the image.\n"
        "[First unfaithful sentence]: There is a small red triangle in the top middle."
    )


def test_faithful_reply_leaves_the_first_unfaithful_sentence_blank():
    chain = [CHAIN[0], "There is a small yellow triangle in the top middle.", *CHAIN[2:]]
    reply = judge_reply(render(generate_scene(0, 1)), chain)
    assert reply.endswith(
        f"[Faithfulness]: FAITHFUL\n[Faithful reasoning chain prefix]: {' '.join(chain)}\n[First unfaithful sentence]:"
    )


def test_first_sentence_unfaithful_gives_a_blank_prefix():
    reply = judge_reply(render(generate_scene(0, 1)), ["There are 3 objects in the image."])
    assert reply.splitlines()[-3:] == [
        "[Faithfulness]: UNFAITHFUL",
        "[Faithful reasoning chain prefix]:",
        "[First unfaithful sentence]: There are 3 objects in the image.",
    ]


def test_description_grammar():
    assert (
        describe(parse_image(render(generate_scene(0, 2))))
        == "The image shows 1 object: a large blue triangle in the top right."
    )
    objects = generate_scene(0, 0).objects
    assert describe(parse_image(render(generate_scene(0, 0)))).startswith(f"The image shows {len(objects)} objects: a ")


_FIELDS = re.compile(
    r"^\[Faithfulness\]: (?P<verdict>FAITHFUL|UNFAITHFUL)\n"
    r"\[Faithful reasoning chain prefix\]:(?: (?P<prefix>.*))?\n"
    r"\[First unfaithful sentence\]:(?: (?P<first>.*))?\Z",
    re.MULTILINE,
)


def test_replies_parse_back_to_the_chain_labels(fixed_scenes):
    for i, scene in enumerate(fixed_scenes[:100]):
        rng = random.Random(i)
        question = make_question(scene, rng, QTYPES[i % len(QTYPES)])
        chain = hallucinated_chain(scene, question, rng) if i % 2 else None
        chain = chain.chain if chain is not None else reference_chain(scene, question)
        reply = judge_reply(render(scene), chain.sentences)
        lines = reply.split("\n")
        assert lines[0].startswith("The image shows ")
        assert lines[1 : 1 + len(chain.steps)] == [
            f"Sentence {k}: {s.kind.upper()}" for k, s in enumerate(chain.steps, start=1)
        ]
        match = _FIELDS.search(reply)
        assert match is not None, reply
        k = chain.first_unfaithful
        assert match.group("verdict") == ("FAITHFUL" if k is None else "UNFAITHFUL")
        assert (match.group("first") or "") == ("" if k is None else chain.sentences[k])
        assert (match.group("prefix") or "") == " ".join(chain.sentences[: len(chain.steps) if k is None else k])
