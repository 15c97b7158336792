"""Claim readers: what a sentence claims, as a key that two sentences share when they say the same thing.

The consistency detector compares the step the model wrote with the sentences it samples from the same
prefix. Comparing strings would count "There are 3 circles." and "There are three circles." as a
disagreement, so sentences are compared by a key that stands for their claim. The reader is chosen by
the `consistency_claims` setting: a name registered here, or `package.module:Class` for a reader of
the team's own (a domain grammar, or an NLI model: SelfCheckGPT's best variant asks an NLI model whether
each sample supports the sentence; none can be downloaded here, so none is shipped).

`words` (the default) reads free text: the set of content words, lower-cased, numbers as digits,
function words and punctuation dropped. It is blunt (it cannot tell "left of" from "right of" once the
order is lost, so it keeps relation words in the key; it cannot see that "crimson" is "red"), but it
needs no model and it is exact on generators that describe what they see in a fixed vocabulary.
"""

from __future__ import annotations

import abc
import importlib
import re
from collections.abc import Hashable
from typing import ClassVar

from faithproxy.faithcore.keyword_typer import keyword_kind
from faithproxy.faithcore.registry import Entry, Registry, UnknownName
from faithproxy.faithcore.types import StepKind


class ClaimReader(abc.ABC):
    """Reads the claim of one sentence."""

    name: ClassVar[str]

    @abc.abstractmethod
    def key(self, sentence: str) -> Hashable | None:
        """A key equal for sentences that make the same claim about the image; None for a sentence that
        makes none (reasoning, an answer line, text the reader cannot read)."""

    def kind(self, sentence: str) -> str | None:
        """The kind of claim the sentence makes ("count", ...), which the routed detector routes by;
        None when the reader cannot tell (the step then takes the `*` route)."""
        return None


_NUMBERS = {w: str(i) for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_NUMBERS |= {"no": "0", "a": "1", "an": "1", "single": "1"}
_COUNT_WORDS = frozenset([*"zero one two three four five six seven eight nine ten".split(), "no"])
_FUNCTION_WORDS = frozenset(
    "the is are there of in on at and with this that image picture photo it its to be has have".split()
)


class ContentWords(ClaimReader):
    """The set of content words (see the module docstring)."""

    name: ClassVar[str] = "words"

    def key(self, sentence: str) -> Hashable | None:
        if keyword_kind(sentence) is not StepKind.PERCEPTION:
            return None
        words = re.findall(r"[a-z0-9]+", sentence.casefold())
        key = frozenset(_NUMBERS.get(w, w) for w in words if w not in _FUNCTION_WORDS)
        return key or None

    def kind(self, sentence: str) -> str | None:
        """ "count" for a perception sentence that states a number (digits, or a number word: "a" and "an"
        are not counted, "no" is), "object" for any other perception sentence, None otherwise."""
        if keyword_kind(sentence) is not StepKind.PERCEPTION:
            return None
        words = re.findall(r"[a-z0-9]+", sentence.casefold())
        return "count" if any(w.isdigit() or w in _COUNT_WORDS for w in words) else "object"


CLAIM_READERS: Registry[type[ClaimReader]] = Registry(
    "claim reader",
    ClaimReader,
    {"words": Entry("faithproxy.detectors.claim_readers:ContentWords", "content words of free text")},
)


def claim_reader(spec: str) -> ClaimReader:
    """The reader registered as `spec`, or the class `package.module:Class` names (a ClaimReader)."""
    if ":" not in spec:
        return CLAIM_READERS.resolve(spec)()
    module_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UnknownName("claim reader", spec, CLAIM_READERS) from exc
    if not (isinstance(cls, type) and issubclass(cls, ClaimReader)):
        raise TypeError(f"{spec} is not a ClaimReader")
    return cls()
