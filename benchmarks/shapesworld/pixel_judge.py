"""The pixel judge: verdicts on a chain's sentences read off a ShapesWorld image itself.

The image is read by the scene parser (parser.py: pixels, not a stored scene) and each sentence by the
world's grammar (language.py, claims.py), then checked against the parsed objects; sentences the
grammar cannot read are typed REASONING and never flagged. It is the ground truth the judge stand-in
(benchmarks/standins/judge_server.py, `--shapesworld`) and the ShapesWorld benchmark
judge by; `verdicts` has the shape of the stand-in's oracles.
"""

from __future__ import annotations

from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_chain
from faithproxy.benchmarks.shapesworld.judge_reply import describe
from faithproxy.benchmarks.shapesworld.parser import parse_image
from faithproxy.faithcore.types import StepKind


class PixelJudge:
    """Verdicts read off the image: the ShapesWorld scene parser and the world's sentence grammar."""

    def verdicts(self, sentences: list[str], images: list[bytes]) -> tuple[str, list[StepKind], list[bool]]:
        """(the image's description, the kind of each sentence, whether each is an unfaithful claim).
        Raises ValueError without an image: the pixel judge needs it inline (base64 or a data URL)."""
        if not images:
            raise ValueError("the pixel judge needs the image inline (base64 or a data URL)")
        scene = parse_image(images[-1])  # the proxy sends one image per judge call; the latest wins
        checks = check_chain(sentences, scene.objects).sentences
        kinds = [StepKind.PERCEPTION if c.kind == PERCEPTION else StepKind.REASONING for c in checks]
        return describe(scene), kinds, [c.faithful is False for c in checks]


class NoisyPixelJudge:
    """A judge of set quality: the pixel judge's verdicts, each flipped by a seeded coin so that the
    flags have `precision` and `recall` on steps whose base rate of false sentences is `base_rate`.

    A false sentence is flagged with probability `recall`; a true one with the false-positive rate that
    gives `precision` at that base rate: fpr = recall * b * (1 - precision) / (precision * (1 - b)).
    The coin of a sentence is a hash of (seed, image, sentence), so the same sentence about the same
    image gets the same verdict in every call of a chain and in every run: a team's judge is wrong about
    a step the same way each time it is asked. It answers like the pixel judge otherwise.
    """

    def __init__(self, precision: float, recall: float, base_rate: float, seed: int = 0) -> None:
        if not (0 < precision <= 1 and 0 <= recall <= 1 and 0 < base_rate < 1):
            raise ValueError("precision in (0, 1], recall in [0, 1], base_rate in (0, 1)")
        self.precision, self.recall, self.seed = precision, recall, seed
        self.false_positive_rate = min(1.0, recall * base_rate * (1 - precision) / (precision * (1 - base_rate)))
        self.oracle = PixelJudge()

    def _coin(self, image: bytes, sentence: str) -> float:
        import hashlib

        digest = hashlib.sha256(f"{self.seed}\0{sentence}\0".encode() + hashlib.sha256(image).digest()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def verdicts(self, sentences: list[str], images: list[bytes]) -> tuple[str, list[StepKind], list[bool]]:
        description, kinds, false = self.oracle.verdicts(sentences, images)
        flags = []
        for sentence, kind, wrong in zip(sentences, kinds, false, strict=True):
            chance = self.recall if wrong else self.false_positive_rate
            flags.append(kind is StepKind.PERCEPTION and self._coin(images[-1], sentence) < chance)
        return description, kinds, flags
