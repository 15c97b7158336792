"""The pixel judge: verdicts on a chain's sentences read off a ShapesWorld image itself.

The image is read by the scene parser (parser.py: pixels, not a stored scene) and each sentence by the
world's grammar (language.py, claims.py), then checked against the parsed objects; sentences the
grammar cannot read are typed REASONING and never flagged. It is the ground truth the judge stand-in
(benchmarks/standins/judge_server.py, `--shapesworld`) and the ShapesWorld benchmark
judge by; `verdicts` has the shape of the stand-in's oracles.
"""

from __future__ import annotations

from faithproxy.faithcore.types import StepKind
from faithproxy.shapesworld.claims import PERCEPTION, check_chain
from faithproxy.shapesworld.judge_reply import describe
from faithproxy.shapesworld.parser import parse_image


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
