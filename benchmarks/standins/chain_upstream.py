"""A scripted OpenAI-compatible upstream that decodes long reasoning chains at a set token rate.

The judge-cost benchmark needs chains of 20 to 150 sentences decoded like a real model does them (one
token at a time, at the generator's speed), some with a planted unfaithful sentence that the proxy
must regenerate and continue after. No model: the chain is written by `chain_sentences(n, seed)` and
the request names it in its question (`chain n=150 seed=3 planted=75`), so the local judge's oracle
can know the planted sentence in advance.

    POST /v1/chat/completions
        stream=true   the chain, in 4-character deltas (a token, as the judge server counts them),
                      one every `token_s` after `ttft_s`; a continuation (an assistant message last,
                      continue_final_message) resumes after the sentences its partial message holds
        stream=false  a regeneration: `n` choices, each the planted sentence corrected, in brackets
    GET  /v1/models, /health

Only loopback addresses are served; timing comes from `asyncio.sleep`, so the figures measure the
proxy and the judge, never this server's own work.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

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


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {
        "id": "chatcmpl-chain",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _already_written(messages: list[dict[str, Any]]) -> int:
    """Sentences in the partial assistant message of a continuation (each ends with '.')."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or not isinstance(last.get("content"), str):
        return 0
    return len(re.findall(r"\.(?:\s|$)", last["content"]))


def create_app(token_s: float = 0.02, ttft_s: float = 0.05) -> FastAPI:
    """`token_s`: seconds per generated token; `ttft_s`: before the first token of every stream (the
    prefill of a continuation included)."""
    app = FastAPI(title="faithproxy chain upstream")
    app.state.token_s = token_s
    app.state.ttft_s = ttft_s
    app.state.streams = 0
    app.state.regenerations = 0

    @app.get("/health")
    async def health() -> Response:
        return Response()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        messages = body.get("messages") or []
        spec = ChainSpec.find(json.dumps(messages))
        if spec is None:
            return JSONResponse({"error": {"message": "no chain spec in the request", "type": "BadRequest"}}, 400)
        if not body.get("stream"):
            app.state.regenerations += 1
            index = spec.planted if spec.planted is not None else 0
            fixed = corrected_sentence(spec.n, spec.seed, index)
            await asyncio.sleep(app.state.ttft_s + app.state.token_s * (len(fixed) + 2) / TOKEN_CHARS)
            choices = [
                {"index": i, "message": {"role": "assistant", "content": f"[{fixed}]"}, "finish_reason": "stop"}
                for i in range(int(body.get("n") or 1))
            ]
            usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
            return JSONResponse(
                {"id": "c", "object": "chat.completion", "model": MODEL, "choices": choices, "usage": usage}
            )
        app.state.streams += 1
        written = _already_written(messages)
        rest = spec.sentences()[written:]
        text = (" " if written else "") + " ".join(rest)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[bytes]:
            yield _chunk({"role": "assistant", "content": ""})
            await asyncio.sleep(app.state.ttft_s)
            start = asyncio.get_running_loop().time()
            for i in range(0, len(text), TOKEN_CHARS):
                # paced against the stream's start, so sleeping's own overshoot does not add up
                due = start + app.state.token_s * (i // TOKEN_CHARS + 1)
                await asyncio.sleep(max(0.0, due - asyncio.get_running_loop().time()))
                yield _chunk({"content": text[i : i + TOKEN_CHARS]})
            yield _chunk({}, "stop")
            if include_usage:
                tokens = -(-len(text) // TOKEN_CHARS)
                usage = {"prompt_tokens": 100, "completion_tokens": tokens, "total_tokens": 100 + tokens}
                yield b"data: " + json.dumps({"id": "chatcmpl-chain", "choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
