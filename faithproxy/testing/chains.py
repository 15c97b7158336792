"""Long reasoning chains decoded at a set token rate (the judge-cost benchmark's upstream).

A chain of 20 to 150 sentences is written by `chain_sentences(n, seed)`, and the request names it in
its question (`chain n=150 seed=3 planted=75`), so a local judge's oracle can know the planted
unfaithful sentence in advance. Streamed, the chain comes in 4-character deltas (a token, as the judge
stand-in counts them), one every `token_s` after `ttft_s`; a continuation (an assistant message last,
continue_final_message) resumes after the sentences its partial message holds. Non-streamed (a
regeneration): `n` choices, each the planted sentence corrected, in brackets. Timing is a schedule of
sleeps, so figures measure the proxy and the judge, never the fake's own work.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from faithproxy.testing.answer import Answer, At, Pause, Step, Stream
from faithproxy.testing.wire import DONE, error_body, event

MODEL = "chain-model"
TOKEN_CHARS = 4
_SPEC = re.compile(r"chain n=(\d+) seed=(\d+)(?: planted=(\d+))?")

_COLOURS = ("red", "blue", "green", "yellow", "white", "black", "orange", "grey")
_THINGS = ("car", "truck", "bicycle", "lamp post", "bench", "dog", "umbrella", "shop sign", "bus", "tree")
_PLACES = ("left edge", "right edge", "centre", "top corner", "bottom corner", "background", "foreground")
_RELATIONS = ("to the left of", "to the right of", "in front of", "behind", "next to", "above")
_PERCEPTION = (
    "The {c1} {t1} stands {r} the {c2} {t2} near the {p} of the picture.",
    "A {c1} {t1} is partly hidden {r} the {c2} {t2} in the {p}.",
    "I can see exactly {k} {c1} objects along the {p} of the image.",
    "The {t1} in the {p} has a {c1} stripe and sits {r} the {t2}.",
)
_REASONING = (
    "So the {t1} must be closer to the camera than the {t2}, which narrows the choice down.",
    "That means the question is about the {t2}, not about anything else in the scene.",
    "If the {t1} were {c2}, option B would fit, but the evidence points the other way.",
    "Counting them again gives {k} in total, so the earlier estimate still holds.",
)


def _fill(template: str, rng: random.Random) -> str:
    c1, c2 = rng.sample(_COLOURS, 2)
    t1, t2 = rng.sample(_THINGS, 2)
    return template.format(
        c1=c1, c2=c2, t1=t1, t2=t2, p=rng.choice(_PLACES), r=rng.choice(_RELATIONS), k=rng.randint(2, 9)
    )


def chain_sentences(n: int, seed: int = 0) -> list[str]:
    """A reasoning chain of `n` sentences, about three perception to two reasoning (the paper's human
    study: 3.3 perception steps in 5.7), each about 80 characters (20 tokens)."""
    rng = random.Random(seed)
    return [_fill(rng.choice(_PERCEPTION if rng.random() < 0.6 else _REASONING), rng) for _ in range(n)]


def planted_sentence(n: int, seed: int, index: int) -> str:
    """The unfaithful sentence put in place of sentence `index` of a chain."""
    return f"The {_THINGS[(n + seed + index) % len(_THINGS)]} in the centre is painted bright purple."


def corrected_sentence(n: int, seed: int, index: int) -> str:
    """What a regeneration of the planted sentence gives back (faithful by the benchmark's oracle)."""
    return f"The {_THINGS[(n + seed + index) % len(_THINGS)]} in the centre is painted dark grey."


@dataclass(frozen=True)
class ChainSpec:
    """Which chain a request asks for: its length, its seed and the sentence planted wrong, if any."""

    n: int
    seed: int
    planted: int | None = None

    @property
    def question(self) -> str:
        planted = "" if self.planted is None else f" planted={self.planted}"
        return f"What is in the picture? (chain n={self.n} seed={self.seed}{planted})"

    def sentences(self) -> list[str]:
        out = chain_sentences(self.n, self.seed)
        if self.planted is not None:
            out[self.planted] = planted_sentence(self.n, self.seed, self.planted)
        return out

    def text(self) -> str:
        return " ".join(self.sentences())

    @classmethod
    def find(cls, text: str) -> ChainSpec | None:
        match = _SPEC.search(text)
        if match is None:
            return None
        planted = int(match.group(3)) if match.group(3) is not None else None
        return cls(int(match.group(1)), int(match.group(2)), planted)


def _chunk(body: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {
        "id": "chatcmpl-chain",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": body, "logprobs": None, "finish_reason": finish}],
    }
    return event(obj)


def _already_written(messages: list[dict[str, Any]]) -> int:
    """Sentences in the partial assistant message of a continuation (each ends with '.')."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or not isinstance(last.get("content"), str):
        return 0
    return len(re.findall(r"\.(?:\s|$)", last["content"]))


_NO_SPEC = Answer.json(400, error_body("no chain spec in the request", "BadRequest"))


@dataclass
class Chain:
    """The chain script; `streams` and `regenerations` count what it was asked for."""

    token_s: float = 0.02
    ttft_s: float = 0.05
    model: str = MODEL
    streams: int = 0
    regenerations: int = 0

    def stream(self, body: dict[str, Any]) -> Stream | Answer:
        messages = body.get("messages") or []
        spec = ChainSpec.find(json.dumps(messages))
        if spec is None:
            return _NO_SPEC
        self.streams += 1
        written = _already_written(messages)
        text = (" " if written else "") + " ".join(spec.sentences()[written:])
        content: list[Step] = []
        for i in range(0, len(text), TOKEN_CHARS):
            content += [At(self.token_s * (i // TOKEN_CHARS + 1)), _chunk({"content": text[i : i + TOKEN_CHARS]})]
        closing = [_chunk({}, "stop")]
        if (body.get("stream_options") or {}).get("include_usage"):
            tokens = -(-len(text) // TOKEN_CHARS)
            usage = {"prompt_tokens": 100, "completion_tokens": tokens, "total_tokens": 100 + tokens}
            closing.append(event({"id": "chatcmpl-chain", "choices": [], "usage": usage}))
        opening = (_chunk({"role": "assistant", "content": ""}), Pause(self.ttft_s))
        return Stream(opening, tuple(content), (*closing, DONE))

    def reply(self, body: dict[str, Any]) -> Answer:
        spec = ChainSpec.find(json.dumps(body.get("messages") or []))
        if spec is None:
            return _NO_SPEC
        self.regenerations += 1
        fixed = corrected_sentence(spec.n, spec.seed, spec.planted if spec.planted is not None else 0)
        choices = [
            {"index": i, "message": {"role": "assistant", "content": f"[{fixed}]"}, "finish_reason": "stop"}
            for i in range(int(body.get("n") or 1))
        ]
        usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
        reply = {"id": "c", "object": "chat.completion", "model": MODEL, "choices": choices, "usage": usage}
        seconds = self.ttft_s + self.token_s * (len(fixed) + 2) / TOKEN_CHARS
        return Answer.json(200, json.dumps(reply).encode(), before=(Pause(seconds),))
