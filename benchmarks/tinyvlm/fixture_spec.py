"""The fixture model's world: images, questions, and the reasoning chains it is trained to produce.

Five square images (simple coloured shapes on white, drawn with PIL) each come with a multiple-choice
question and the chain the fixture model emits for them under greedy decoding:

    <think>\\n{sentence} {sentence} ...\\n</think>\\n\\nThe answer is {letter}.

Three chains contain a PLANTED wrong perception sentence. For those the model is also trained on

- regeneration: `build_regeneration_prompt(question, chain[:planted], chain[planted])` with the image
  → `[corrected sentence]`. For `blue_square` the regeneration FAILS on purpose: it answers another
  wrong sentence (`The shape is a circle.`), and given that one as the flagged step it answers the
  planted sentence again, so every try is wrong and the proxy's residual path runs;
- continuation: the chat with a partial assistant message `partial_text(...)` (the chain up to and
  including a rewrite of the planted slot, no trailing space), continued with
  `continue_final_message=True, add_generation_prompt=False` → `continuation_text(...)`, which starts
  with a space and ends with the answer. The correction leads to the correct answer, the planted
  sentence (and the failed rewrite) to a wrong one;
- self-check: `build_self_check_prompt(question, prefix, sentence)` with the image → `FAITHFUL` or
  `UNFAITHFUL` for every sentence of every chain variant (reasoning sentences count as FAITHFUL).

`red_circle`/`green_circle` and `blue_square`/`yellow_triangle` share a question, so the model has to
look at the image to pick its chain. No unfaithful sentence text occurs as a faithful one anywhere, so
the text-only oracle (`oracle_json`) is unambiguous.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from dataclasses import asdict, dataclass

from faithproxy.faithcore.types import StepKind

IMAGE_SIZE = 112  # square on purpose: a trial saw vLLM and transformers disagree on non-square grids

P = StepKind.PERCEPTION
R = StepKind.REASONING

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 160, 70),
    "blue": (40, 70, 220),
    "yellow": (235, 200, 30),
}
CENTRES_X = {"left": 30, "middle": 56, "right": 82}
RADIUS = 20


@dataclass(frozen=True)
class Shape:
    kind: str  # circle | square | triangle
    colour: str  # a key of COLOURS
    position: str  # left | middle | right


@dataclass(frozen=True)
class Sentence:
    text: str
    kind: StepKind
    faithful: bool = True


@dataclass(frozen=True)
class Rewrite:
    """A sentence for the planted slot, with the rest of the chain the model continues with after it."""

    sentence: Sentence
    rest: tuple[Sentence, ...]
    answer: str


@dataclass(frozen=True)
class Fixture:
    name: str
    shapes: tuple[Shape, ...]
    question: str
    correct_answer: str
    chain: tuple[Sentence, ...]
    answer: str  # the letter the chain ends with (wrong when the planted sentence misleads it)
    planted: int | None = None  # index into `chain` of the planted wrong perception sentence
    rewrites: tuple[Rewrite, ...] = ()  # trained continuations after other sentences in the planted slot
    # (flagged sentence, replied sentence): what the regeneration prompt answers, in square brackets
    regeneration: tuple[tuple[str, str], ...] = ()

    @property
    def sentences(self) -> list[str]:
        return [s.text for s in self.chain]

    @property
    def planted_sentence(self) -> str | None:
        return None if self.planted is None else self.chain[self.planted].text

    @property
    def prefix(self) -> list[str]:
        """The faithful sentences before the planted one (the regeneration prompt's `prefix`)."""
        return self.sentences[: self.planted] if self.planted is not None else self.sentences

    @property
    def correction(self) -> Rewrite | None:
        return next((r for r in self.rewrites if r.sentence.faithful), None)

    @property
    def regeneration_reply(self) -> str | None:
        """The model's whole reply to the first regeneration prompt, brackets included."""
        if self.planted_sentence is None:
            return None
        return f"[{dict(self.regeneration)[self.planted_sentence]}]"

    @property
    def regeneration_succeeds(self) -> bool:
        correction = self.correction
        return correction is not None and self.regeneration_reply == f"[{correction.sentence.text}]"

    def rewrite_for(self, sentence: str) -> Rewrite:
        """The trained continuation after `sentence` in the planted slot (the planted one included)."""
        assert self.planted is not None
        if sentence == self.planted_sentence:
            return Rewrite(self.chain[self.planted], self.chain[self.planted + 1 :], self.answer)
        return next(r for r in self.rewrites if r.sentence.text == sentence)


Q_COLOUR = "What colour is the shape? Options: A. red B. blue C. green"
Q_CORNERS = "How many corners does the shape have? Options: A. 0 B. 3 C. 4"
Q_LEFT = "Which shape is on the left? Options: A. the square B. the circle"

FIXTURES: tuple[Fixture, ...] = (
    Fixture(
        name="red_circle",
        shapes=(Shape("circle", "red", "left"),),
        question=Q_COLOUR,
        correct_answer="A",
        chain=(
            Sentence("The image shows one circle.", P),
            Sentence("It is near the left edge.", P),
            Sentence("The circle is blue.", P, faithful=False),
            Sentence("The question asks for the colour of the shape.", R),
            Sentence("Blue is option B.", R),
        ),
        answer="B",
        planted=2,
        rewrites=(
            Rewrite(
                Sentence("The circle is red.", P),
                (Sentence("The question asks for the colour of the shape.", R), Sentence("Red is option A.", R)),
                "A",
            ),
        ),
        regeneration=(("The circle is blue.", "The circle is red."),),
    ),
    Fixture(
        name="green_circle",
        shapes=(Shape("circle", "green", "left"),),
        question=Q_COLOUR,
        correct_answer="C",
        chain=(
            Sentence("The image shows one circle.", P),
            Sentence("It is near the left edge.", P),
            Sentence("The circle is green.", P),
            Sentence("The question asks for the colour of the shape.", R),
            Sentence("Green is option C.", R),
        ),
        answer="C",
    ),
    Fixture(
        name="blue_square",
        shapes=(Shape("square", "blue", "right"),),
        question=Q_CORNERS,
        correct_answer="C",
        chain=(
            Sentence("The image shows one blue shape.", P),
            Sentence("The shape is a triangle.", P, faithful=False),
            Sentence("The shape is on the right side.", P),
            Sentence("A triangle has three corners.", R),
            Sentence("So the shape has 3 corners.", R),
        ),
        answer="B",
        planted=1,
        rewrites=(
            Rewrite(
                Sentence("The shape is a square.", P),
                (
                    Sentence("The shape is on the right side.", P),
                    Sentence("A square has four corners.", R),
                    Sentence("So the shape has 4 corners.", R),
                ),
                "C",
            ),
            Rewrite(
                Sentence("The shape is a circle.", P, faithful=False),
                (
                    Sentence("The shape is on the right side.", P),
                    Sentence("A circle has no corners.", R),
                    Sentence("So the shape has 0 corners.", R),
                ),
                "A",
            ),
        ),
        # The failing regeneration: every try answers a wrong sentence (the two alternate).
        regeneration=(
            ("The shape is a triangle.", "The shape is a circle."),
            ("The shape is a circle.", "The shape is a triangle."),
        ),
    ),
    Fixture(
        name="yellow_triangle",
        shapes=(Shape("triangle", "yellow", "middle"),),
        question=Q_CORNERS,
        correct_answer="B",
        chain=(
            Sentence("The image shows one yellow shape.", P),
            Sentence("The yellow shape is a triangle.", P),
            Sentence("It sits in the middle.", P),
            Sentence("A triangle has three corners.", R),
            Sentence("So the shape has 3 corners.", R),
        ),
        answer="B",
    ),
    Fixture(
        name="square_and_circle",
        shapes=(Shape("square", "red", "left"), Shape("circle", "blue", "right")),
        question=Q_LEFT,
        correct_answer="A",
        chain=(
            Sentence("The image shows two shapes.", P),
            Sentence("The square is red and the circle is blue.", P),
            Sentence("The circle is on the left.", P, faithful=False),
            Sentence("The question asks which shape is on the left.", R),
            Sentence("So the left shape is the circle.", R),
        ),
        answer="B",
        planted=2,
        rewrites=(
            Rewrite(
                Sentence("The square is on the left.", P),
                (
                    Sentence("The question asks which shape is on the left.", R),
                    Sentence("So the left shape is the square.", R),
                ),
                "A",
            ),
        ),
        regeneration=(("The circle is on the left.", "The square is on the left."),),
    ),
)

BY_NAME: dict[str, Fixture] = {f.name: f for f in FIXTURES}
FAILING_REGENERATION = "blue_square"  # the fixture whose regeneration never yields a faithful sentence


def get(name: str) -> Fixture:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown fixture {name!r}; known: {', '.join(BY_NAME)}") from None


# --- texts ------------------------------------------------------------------------------------------


def answer_text(letter: str) -> str:
    return f"The answer is {letter}."


def chain_text(fixture: Fixture) -> str:
    """The whole assistant reply the model gives for the fixture's image and question."""
    return f"<think>\n{' '.join(fixture.sentences)}\n</think>\n\n{answer_text(fixture.answer)}"


def partial_text(fixture: Fixture, sentence: str) -> str:
    """The partial assistant message to continue from: the chain up to `sentence` in the planted slot.

    No trailing space: the continuation starts with one (a trailing space here would tokenize
    differently from training and derail the model).
    """
    return "<think>\n" + " ".join([*fixture.prefix, sentence])


def continuation_text(rewrite: Rewrite) -> str:
    """What the model appends to `partial_text(...)` for that rewrite."""
    return "".join(" " + s.text for s in rewrite.rest) + f"\n</think>\n\n{answer_text(rewrite.answer)}"


def corrected_chain_text(fixture: Fixture) -> str:
    """The chain as the proxy should deliver it once the planted sentence is corrected."""
    correction = fixture.correction
    assert correction is not None
    return partial_text(fixture, correction.sentence.text) + continuation_text(correction)


def chain_variants(fixture: Fixture) -> list[tuple[list[Sentence], str]]:
    """Every chain the model is trained to produce for the fixture: (sentences, answer letter)."""
    variants = [(list(fixture.chain), fixture.answer)]
    if fixture.planted is not None:
        head = list(fixture.chain[: fixture.planted])
        variants += [([*head, r.sentence, *r.rest], r.answer) for r in fixture.rewrites]
    return variants


def self_check_cases(fixture: Fixture) -> list[tuple[list[str], Sentence]]:
    """(prefix sentences, sentence) for every sentence of every chain variant, without repeats."""
    seen: set[tuple[str, ...]] = set()
    cases = []
    for sentences, _ in chain_variants(fixture):
        for i, sentence in enumerate(sentences):
            key = tuple(s.text for s in sentences[: i + 1])
            if key not in seen:
                seen.add(key)
                cases.append(([s.text for s in sentences[:i]], sentence))
    return cases


def oracle_json() -> dict:
    """The local judge's oracle: every unfaithful sentence the fixture model can produce."""
    unfaithful: list[str] = []
    for fixture in FIXTURES:
        for sentences, _ in chain_variants(fixture):
            unfaithful += [s.text for s in sentences if not s.faithful and s.text not in unfaithful]
        for _, reply in fixture.regeneration:
            if reply not in unfaithful and not _is_faithful_text(fixture, reply):
                unfaithful.append(reply)
    # The reasoning sentences too, so the local judge types them as the fixture labels them.
    reasoning = sorted(
        {s.text for f in FIXTURES for v, _ in chain_variants(f) for s in v if s.kind is R}
        | {answer_text(f.answer) for f in FIXTURES}
        | {answer_text(r.answer) for f in FIXTURES for r in f.rewrites}
    )
    return {"unfaithful": unfaithful, "reasoning": reasoning}


def _is_faithful_text(fixture: Fixture, text: str) -> bool:
    for sentences, _ in chain_variants(fixture):
        for s in sentences:
            if s.text == text:
                return s.faithful
    raise ValueError(f"{fixture.name}: regeneration reply {text!r} is not a sentence of any chain variant")


def validate() -> None:
    """Consistency rules the training data relies on; raises AssertionError."""
    faithful_texts = {s.text for f in FIXTURES for v, _ in chain_variants(f) for s in v if s.faithful}
    for text in oracle_json()["unfaithful"]:
        assert text not in faithful_texts, f"{text!r} is faithful in some fixture"
    chains = [chain_text(f) for f in FIXTURES]
    assert len(set(chains)) == len(chains), "two fixtures share a chain"
    for f in FIXTURES:
        assert 4 <= len(f.chain) <= 7, f.name
        assert sum(s.kind is P for s in f.chain) >= 2, f.name
        if f.planted is None:
            assert all(s.faithful for s in f.chain) and f.answer == f.correct_answer, f.name
            continue
        planted = f.chain[f.planted]
        assert planted.kind is P and not planted.faithful, f.name
        assert f.planted + 1 < len(f.chain), f"{f.name}: the planted sentence must not end the chain"
        assert f.correction is not None and f.correction.answer == f.correct_answer, f.name
        for rewrite in f.rewrites:
            assert rewrite.rest, f"{f.name}: every rewrite needs a rest"
        for bad, reply in f.regeneration:
            f.rewrite_for(bad), f.rewrite_for(reply)  # both must have trained continuations
        assert (f.name == FAILING_REGENERATION) != f.regeneration_succeeds, f.name


# --- images -----------------------------------------------------------------------------------------


def render_fixture_image(name: str) -> bytes:
    """The fixture's image as PNG bytes (deterministic: same pixels on every run)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    cy = IMAGE_SIZE // 2
    for shape in get(name).shapes:
        cx, colour = CENTRES_X[shape.position], COLOURS[shape.colour]
        box = (cx - RADIUS, cy - RADIUS, cx + RADIUS, cy + RADIUS)
        if shape.kind == "circle":
            draw.ellipse(box, fill=colour)
        elif shape.kind == "square":
            draw.rectangle(box, fill=colour)
        elif shape.kind == "triangle":
            draw.polygon([(cx, cy - RADIUS), (cx + RADIUS, cy + RADIUS), (cx - RADIUS, cy + RADIUS)], fill=colour)
        else:
            raise ValueError(f"unknown shape {shape.kind!r}")
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue()


def load_image(name: str):  # -> PIL.Image.Image
    from PIL import Image

    return Image.open(io.BytesIO(render_fixture_image(name))).convert("RGB")


def data_url(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode(render_fixture_image(name)).decode("ascii")


def spec_json() -> str:
    """A canonical dump of the whole spec (part of the built model's digest)."""
    data = {"image_size": IMAGE_SIZE, "fixtures": [asdict(f) for f in FIXTURES]}
    return json.dumps(data, sort_keys=True, default=str)


def spec_sha256() -> str:
    return hashlib.sha256(spec_json().encode()).hexdigest()
