"""A local judge server with an oracle, speaking both judge wire protocols.

Tests, the demo and the benchmarks need a judge that is real on the wire (the official anthropic and
openai SDKs talk to it unchanged) but whose answers are known in advance. This server reads our judge
prompt back (`parse_judge_prompt_details`), asks an ORACLE which sentences are unfaithful, and replies
in the judge format of `detectors/judge_prompt.py`, like an obedient judge: it describes the image
only when asked, types only the sentences it is asked to check, and never reports a context sentence.

    POST /v1/messages           Anthropic Messages API (non-streaming)
    POST /v1/chat/completions   OpenAI chat completions (non-streaming)
    GET  /_stats                {"requests", "sentences_judged", "by_protocol", "last_request", "tokens",
                                 "descriptions", "latency_model"}
    POST /_control              {"latency_s"?, "input_token_s"?, "output_token_s"?, "mode"?,
                                 "obey_checked"?, "reset_stats"?} -> state

Tokens and prompt caching, like the real servers (`ServedTokens`): a prompt is counted at about four
characters per token and `image_tokens` per image. The Messages API honours `cache_control`: a prompt
prefix ending at a marked block is stored, and a later request reads the longest stored prefix that ends
at one of its breakpoints or at any of the 20 block boundaries before each (Anthropic's look-back); the
usage then carries `cache_read_input_tokens` and `cache_creation_input_tokens` beside `input_tokens`.
The chat completions endpoint caches like vLLM's automatic prefix caching: every full block of 16
tokens whose whole prefix was seen before is served from cache, whatever the request marks, and
`usage.prompt_tokens_details.cached_tokens` says how many.

Latency follows a real VLM's token timing: `latency_s` (a fixed part: network, scheduling) plus
`input_token_s` per prompt token not served from cache (prefill) plus `output_token_s` per output token
(decode), all 0 by default.

A hint request of the proxy's collaborative hint inference (server/hints.py) gets the fixed HINT_REPLY,
and the whole-chain evaluation prompt of `faithproxy bench judge-upr` a block per sentence with the
oracle's (or the pixels') labels.

`sentences_judged` counts the sentences each request asked about (context sentences excluded), so a
test or a benchmark sees batching as requests < sentences_judged.

Oracle file (JSON):

    {"unfaithful": ["The man wears a red scarf.", ...],   # unfaithful iff the normalised text is listed
     "reasoning": ["So the answer is B.", ...],            # optional: typed REASONING
     "perception": ["..."],                                # optional: typed PERCEPTION
     "description": "A man in a red hat."}                 # optional: the image description to reply

Typing of sentences in neither list: a small keyword heuristic (conclusions, plans and arithmetic are
REASONING, everything else PERCEPTION); listed unfaithful sentences are always PERCEPTION. Texts are
compared normalised: lower case, single spaces, without surrounding quotes and final punctuation.

Pixel judge (`--shapesworld`, or `create_app(PixelJudge())`): instead of an oracle, the verdicts come
from the image itself. The request's inline image (base64 in Anthropic's source block, or a data URL
in OpenAI's image_url) is read by the ShapesWorld scene parser (shapesworld/parser.py: pixels, not a
stored scene), each sentence is read by the world's grammar (shapesworld/language.py) and checked
against the parsed objects; sentences the grammar cannot read are typed REASONING and never flagged.
A request without an inline image gets a 400 (point the proxy's judge at inline images, or let it
fetch http images: FAITHPROXY_JUDGE_FETCH_IMAGES).

Fault modes (`--mode` or `/_control`): ok | 500 | 429 | garbage (a 200 reply with no judge fields) |
badjson (a 200 reply that is not JSON) | hang (no reply until the client gives up or the server stops).

    python -m faithproxy.benchmarks.standins.judge_server --port 8090 --oracle oracle.json --latency-s 0.5 \
        --input-token-s 0.0002 --output-token-s 0.02
    python -m faithproxy.benchmarks.standins.judge_server --port 8090 --shapesworld
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import dataclasses
import hashlib
import itertools
import json
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from faithproxy.benchmarks.evaluation.judge_upr import parse_evaluation_prompt
from faithproxy.benchmarks.standins.local_server import running_app
from faithproxy.detectors.judge_prompt import parse_judge_prompt_details
from faithproxy.faithcore.types import StepKind

FailMode = Literal["ok", "500", "429", "garbage", "badjson", "hang"]
# Hint requests (collaborative hint inference) get this fixed reply: the server plays the auxiliary LLM.
HINT_REPLY = (
    "[Question type]: attribute\n[Topic hint]: Name each object by its shape and colour before comparing."
    "\n[Question hint]: Look at the object in the middle of the image first."
)
_FIELD_NAMES = re.compile(r"^\[(Question type|Topic hint|Question hint)\]:", re.MULTILINE)
_HINT_FIELDS = {"Question type", "Topic hint", "Question hint"}
GARBAGE_REPLY = "I am not sure what you would like me to do with this picture. Could you clarify?"
_REASONING_START = re.compile(
    r"^(so|thus|therefore|hence|because|since|if|let me|let's|i need|i should|i will|we need|wait|hmm|"
    r"the answer|answer|this means|that means|in conclusion)\b",
    re.IGNORECASE,
)
_ARITHMETIC = re.compile(r"\d\s*[-+*/×=]\s*\d")


def normalise(text: str) -> str:
    return " ".join(text.split()).strip(" \"'“”‘’.!?").lower()


@dataclass(frozen=True)
class Oracle:
    """The ground truth the server judges by."""

    unfaithful: frozenset[str] = frozenset()
    reasoning: frozenset[str] = frozenset()
    perception: frozenset[str] = frozenset()
    description: str = "An image used for local testing."

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Oracle:
        def texts(key: str) -> frozenset[str]:
            return frozenset(normalise(t) for t in data.get(key, ()) if isinstance(t, str))

        return cls(
            texts("unfaithful"),
            texts("reasoning"),
            texts("perception"),
            str(data.get("description") or cls.description),
        )

    @classmethod
    def load(cls, path: str | Path) -> Oracle:
        return cls.from_mapping(json.loads(Path(path).read_text(encoding="utf-8")))

    @classmethod
    def of(cls, unfaithful: Iterable[str] = (), **lists: Any) -> Oracle:
        return cls.from_mapping({"unfaithful": list(unfaithful), **lists})

    def is_unfaithful(self, sentence: str) -> bool:
        return normalise(sentence) in self.unfaithful

    def kind(self, sentence: str) -> StepKind:
        text = normalise(sentence)
        if text in self.unfaithful or text in self.perception:
            return StepKind.PERCEPTION
        if text in self.reasoning or _REASONING_START.match(text) or _ARITHMETIC.search(text):
            return StepKind.REASONING
        return StepKind.PERCEPTION

    def reply(self, sentences: list[str], already_checked: int = 0, *, describe: bool = True) -> str:
        """The judge-format reply an obedient, perfect judge would give."""
        return format_reply(*self.verdicts(sentences, []), sentences, already_checked, describe=describe)

    def verdicts(self, sentences: list[str], images: list[bytes]) -> tuple[str, list[StepKind], list[bool]]:
        """(image description, kind of each sentence, whether each is an unfaithful perception)."""
        kinds = [self.kind(s) for s in sentences]
        unfaithful = [k is StepKind.PERCEPTION and self.is_unfaithful(s) for k, s in zip(kinds, sentences, strict=True)]
        return self.description, kinds, unfaithful


class PixelJudge:
    """Verdicts read off the image: the ShapesWorld scene parser and the world's sentence grammar."""

    def verdicts(self, sentences: list[str], images: list[bytes]) -> tuple[str, list[StepKind], list[bool]]:
        from faithproxy.shapesworld.claims import PERCEPTION, check_chain
        from faithproxy.shapesworld.judge_reply import describe
        from faithproxy.shapesworld.parser import parse_image

        if not images:
            raise ValueError("the pixel judge needs the image inline (base64 or a data URL)")
        scene = parse_image(images[-1])  # the proxy sends one image per judge call; the latest wins
        checks = check_chain(sentences, scene.objects).sentences
        kinds = [StepKind.PERCEPTION if c.kind == PERCEPTION else StepKind.REASONING for c in checks]
        return describe(scene), kinds, [c.faithful is False for c in checks]


def format_evaluation(description: str, kinds: list[StepKind], unfaithful: list[bool], sentences: list[str]) -> str:
    """The reply to the evaluation prompt of `faithproxy bench judge-upr` (benchmarks/evaluation/judge_upr.py): a
    block per sentence, every sentence labelled."""
    lines = [f"Image description: {description}"]
    for i, (sentence, kind, wrong) in enumerate(zip(sentences, kinds, unfaithful, strict=True), start=1):
        lines += [f'Sentence {i}: "{sentence}"', f"Type: {kind.name}"]
        if kind is StepKind.PERCEPTION:
            lines.append(f"Faithfulness: {'UNFAITHFUL' if wrong else 'FAITHFUL'}")
    return "\n".join(lines)


def format_reply(
    description: str,
    kinds: list[StepKind],
    unfaithful: list[bool],
    sentences: list[str],
    already_checked: int = 0,
    *,
    describe: bool = True,
) -> str:
    """Our judge reply format (detectors/judge_prompt.py): the description when asked for, a typing line
    for each sentence from `already_checked` on, the verdict, and the first unfaithful one by number.
    Sentences before `already_checked` are neither typed nor reported, as an obedient judge does with
    the context sentences."""
    first = next((i for i in range(already_checked, len(sentences)) if unfaithful[i]), None)
    lines = [f"[Image description]: {description}"] if describe else []
    lines += [f"Sentence {i}: {kinds[i - 1].name}" for i in range(already_checked + 1, len(sentences) + 1)]
    if first is None:
        lines.append("[Faithfulness]: FAITHFUL")
    else:
        lines += ["[Faithfulness]: UNFAITHFUL", f"[First unfaithful sentence]: {first + 1}"]
    return "\n".join(lines)


Verdicts = Oracle | PixelJudge


class Control(BaseModel):
    model_config = ConfigDict(extra="forbid")

    latency_s: float | None = Field(default=None, ge=0)
    input_token_s: float | None = Field(default=None, ge=0)
    output_token_s: float | None = Field(default=None, ge=0)
    mode: FailMode | None = None
    obey_checked: bool | None = None  # False: a disobedient judge that also reports checked sentences
    reset_stats: bool = False


CHARS_PER_TOKEN = 4
IMAGE_TOKENS = 800  # prompt tokens per image (a Qwen2.5-VL image of ~800x800 px; Claude's ~1000x600)
ANTHROPIC_LOOKBACK = 20  # block boundaries searched before each breakpoint
VLLM_BLOCK = 16  # tokens per prefix-cache block (vLLM's GPU default)
_CACHE_ENTRIES = 200_000


def _tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Piece:
    """One block of a prompt as the cache sees it: its identity and its size in tokens."""

    key: str
    tokens: int
    cache: bool = False  # carries cache_control (Messages API)


@dataclass(frozen=True)
class Usage:
    """A reply's usage: the prompt split as the real APIs split it, and the output."""

    input_tokens: int  # not read from cache nor written to it
    output_tokens: int
    cached: int = 0
    created: int = 0

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cached + self.created


class PromptCache:
    """A bounded set of prompt-prefix hashes: what the emulated server has in its cache."""

    def __init__(self, entries: int = _CACHE_ENTRIES) -> None:
        self.entries = entries
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, key: bytes) -> bool:
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        return False

    def add(self, key: bytes) -> None:
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self.entries:
            self._seen.popitem(last=False)

    def clear(self) -> None:
        self._seen.clear()


def _chained(pieces: Sequence[str]) -> list[bytes]:
    """The hash of every prefix: element i covers pieces[0..i]."""
    out, digest = [], b""
    for piece in pieces:
        digest = hashlib.sha256(digest + piece.encode("utf-8", "surrogatepass")).digest()
        out.append(digest)
    return out


def anthropic_usage(cache: PromptCache, pieces: Sequence[Piece], output_tokens: int) -> Usage:
    """Anthropic's accounting: reads up to the furthest stored prefix found at a breakpoint or at one of
    the ANTHROPIC_LOOKBACK block boundaries before it, writes every breakpoint's prefix, and bills the
    tokens between the read and the last breakpoint as written, the rest as plain input."""
    hashes = _chained([p.key for p in pieces])
    ends = list(itertools.accumulate(p.tokens for p in pieces))
    marks = [i for i, p in enumerate(pieces) if p.cache]
    if not marks:
        return Usage(ends[-1] if ends else 0, output_tokens)
    read = -1
    for mark in marks:
        for i in range(mark, max(-1, mark - ANTHROPIC_LOOKBACK - 1), -1):
            if hashes[i] in cache:
                read = max(read, i)
                break
    for mark in marks:
        cache.add(hashes[mark])
    cached = ends[read] if read >= 0 else 0
    created = max(0, ends[marks[-1]] - cached)
    return Usage(ends[-1] - cached - created, output_tokens, cached=cached, created=created)


def vllm_usage(cache: PromptCache, pieces: Sequence[Piece], output_tokens: int) -> Usage:
    """vLLM's automatic prefix caching: the prompt as a token stream (text in 4-character tokens, an
    image as `tokens` copies of its hash), cut in VLLM_BLOCK-token blocks; leading full blocks whose
    whole prefix was seen are served from cache (never the last token: one is always computed)."""
    stream: list[str] = []
    for piece in pieces:
        if piece.key.startswith("text:"):
            text = piece.key[5:]
            stream += [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]
        else:
            stream += [piece.key] * piece.tokens
    total = len(stream)
    blocks = ["\x1f".join(stream[i : i + VLLM_BLOCK]) for i in range(0, total - total % VLLM_BLOCK, VLLM_BLOCK)]
    hashes = _chained(blocks)
    hit = 0
    while hit < len(hashes) and hashes[hit] in cache:
        hit += 1
    for digest in hashes:
        cache.add(digest)
    cached = min(hit * VLLM_BLOCK, max(0, total - 1))
    return Usage(max(1, total) - cached, output_tokens, cached=cached)


@dataclass
class TokenTotals:
    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_creation_tokens: int = 0
    output_tokens: int = 0

    def add(self, usage: Usage) -> None:
        self.input_tokens += usage.input_tokens
        self.cached_input_tokens += usage.cached
        self.cache_creation_tokens += usage.created
        self.output_tokens += usage.output_tokens


@dataclass
class JudgeServerState:
    oracle: Verdicts
    latency_s: float = 0.0  # the fixed part of every reply's latency
    input_token_s: float = 0.0  # per prompt token not served from cache
    output_token_s: float = 0.0  # per output token
    mode: FailMode = "ok"
    obey_checked: bool = True
    hang_s: float = 300.0
    image_tokens: int = IMAGE_TOKENS
    requests: int = 0
    sentences_judged: int = 0
    descriptions: int = 0  # replies that carried an image description
    by_protocol: dict[str, int] = field(default_factory=lambda: {"anthropic": 0, "openai": 0})
    tokens: TokenTotals = field(default_factory=TokenTotals)
    last_request: dict[str, Any] | None = None
    caches: dict[str, PromptCache] = field(
        default_factory=lambda: {"anthropic": PromptCache(), "openai": PromptCache()}
    )
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends every "hang" at shutdown
    ids: itertools.count = field(default_factory=itertools.count)

    def public(self) -> dict[str, Any]:
        return {"latency_s": self.latency_s, "mode": self.mode, "obey_checked": self.obey_checked}

    def latency_model(self) -> dict[str, float]:
        return {"fixed_s": self.latency_s, "input_token_s": self.input_token_s, "output_token_s": self.output_token_s}

    def reply_seconds(self, usage: Usage) -> float:
        """Prefill of what the cache did not serve, decode of the output, and the fixed part."""
        fresh = usage.input_tokens + usage.created
        return self.latency_s + self.input_token_s * fresh + self.output_token_s * usage.output_tokens

    def reset(self) -> None:
        self.requests = self.sentences_judged = self.descriptions = 0
        self.by_protocol = {"anthropic": 0, "openai": 0}
        self.tokens = TokenTotals()
        self.last_request = None
        for cache in self.caches.values():
            cache.clear()


@dataclass
class Parts:
    """What a request carries: its user text (blocks joined as the judge backends join them), its
    images, and its prompt as cache pieces, in order."""

    text: str
    images: list[dict[str, Any]]
    pieces: list[Piece]

    @property
    def breakpoints(self) -> int:
        return sum(1 for p in self.pieces if p.cache)


def _text_piece(text: str, cache: bool = False) -> Piece:
    return Piece("text:" + text, _tokens(text), cache)


def _image_piece(ident: str, tokens: int, cache: bool = False) -> Piece:
    return Piece("image:" + hashlib.sha256(ident.encode()).hexdigest(), tokens, cache)


def anthropic_parts(body: dict[str, Any], image_tokens: int) -> Parts:
    texts, images, pieces = [], [], []
    system = body.get("system")
    if isinstance(system, str) and system:
        pieces.append(_text_piece(system))
    elif isinstance(system, list):
        pieces += [_text_piece(b.get("text", ""), bool(b.get("cache_control"))) for b in system]
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            pieces.append(_text_piece(content))
            continue
        for block in content or []:
            marked = bool(block.get("cache_control"))
            if block.get("type") == "text":
                texts.append(block.get("text", ""))
                pieces.append(_text_piece(texts[-1], marked))
            elif block.get("type") == "image":
                source = block.get("source") or {}
                image = {"source": source.get("type"), "media_type": source.get("media_type")}
                if source.get("type") == "base64":
                    image["bytes"] = _b64(source.get("data"))
                images.append(image)
                pieces.append(_image_piece(json.dumps(source, sort_keys=True), image_tokens, marked))
    return Parts("".join(texts), images, pieces)


def openai_parts(body: dict[str, Any], image_tokens: int) -> Parts:
    texts, images, pieces = [], [], []
    for message in body.get("messages") or []:
        content = message.get("content")
        system = message.get("role") == "system"
        if isinstance(content, str):
            pieces.append(_text_piece(content))
            if not system:
                texts.append(content)
            continue
        for part in content or []:
            if part.get("type") == "text":
                pieces.append(_text_piece(part.get("text", "")))
                if not system:
                    texts.append(part.get("text", ""))
            elif part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                image = {"source": "data" if url.startswith("data:") else "url"}
                if url.startswith("data:"):
                    image["bytes"] = _b64(url.partition(",")[2])
                images.append(image)
                pieces.append(_image_piece(url, image_tokens))
    return Parts("".join(texts), images, pieces)


def _b64(data: Any) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise ValueError(f"image data is not base64: {exc}") from None


def _error(protocol: str, status: int, kind: str, message: str) -> JSONResponse:
    if protocol == "anthropic":
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "code": None, "param": None}}
    return JSONResponse(body, status_code=status)


def create_app(
    oracle: Verdicts | Mapping[str, Any] | str | Path,
    latency_s: float = 0.0,
    *,
    input_token_s: float = 0.0,
    output_token_s: float = 0.0,
    image_tokens: int = IMAGE_TOKENS,
) -> FastAPI:
    """The judge server app; `oracle` may be an `Oracle`, its JSON mapping, a path to the file, or a
    `PixelJudge`. Latency: `latency_s` + `input_token_s` per uncached prompt token + `output_token_s` per
    output token."""
    if isinstance(oracle, str | Path):
        oracle = Oracle.load(oracle)
    elif not isinstance(oracle, Oracle | PixelJudge):
        oracle = Oracle.from_mapping(oracle)
    state = JudgeServerState(
        oracle=oracle,
        latency_s=latency_s,
        input_token_s=input_token_s,
        output_token_s=output_token_s,
        image_tokens=image_tokens,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.release = asyncio.Event()  # bound to the server's own loop
        yield
        state.release.set()

    app = FastAPI(title="faithproxy local judge", lifespan=lifespan)
    app.state.judge = state

    async def judge(protocol: str, request: Request) -> tuple[str, dict[str, Any]] | Response:
        """The reply text and request summary, or the response of a fault mode."""
        state.requests += 1
        state.by_protocol[protocol] += 1
        try:
            body = await request.json()
            parts = (anthropic_parts if protocol == "anthropic" else openai_parts)(body, state.image_tokens)
        except (ValueError, AttributeError, TypeError):
            return _error(protocol, 400, "invalid_request_error", "body is not a chat request")
        text, images = parts.text, parts.images
        if state.latency_s:
            await asyncio.sleep(state.latency_s)
        if state.mode == "hang":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.release.wait(), state.hang_s)
            return _error(protocol, 503, "overloaded_error", "hung")
        if state.mode == "500":
            return _error(protocol, 500, "api_error", "injected failure")
        if state.mode == "429":
            return _error(protocol, 429, "rate_limit_error", "injected rate limit")
        if state.mode == "badjson":
            return PlainTextResponse("{not json", media_type="application/json")
        info = {"model": body.get("model") or "local-judge", "parts": parts}
        if state.mode == "garbage":
            return GARBAGE_REPLY, info
        if _HINT_FIELDS.issubset(set(_FIELD_NAMES.findall(text))):  # a hint request (server/hints.py)
            state.last_request = {"protocol": protocol, "model": body.get("model"), "hint_prompt": text}
            return HINT_REPLY, info
        images_bytes = [i["bytes"] for i in images if "bytes" in i]
        with contextlib.suppress(ValueError):  # the whole-chain evaluation prompt of bench judge-upr
            _, chain = parse_evaluation_prompt(text)
            state.last_request = {"protocol": protocol, "model": body.get("model"), "evaluation": len(chain)}
            try:
                return format_evaluation(*state.oracle.verdicts(chain, images_bytes), chain), info
            except ValueError as exc:
                return _error(protocol, 400, "invalid_request_error", str(exc))
        try:
            prompt = parse_judge_prompt_details(text)
        except ValueError as exc:
            return _error(protocol, 400, "invalid_request_error", str(exc))
        checked = prompt.already_checked if state.obey_checked else 0
        state.sentences_judged += len(prompt.sentences) - prompt.already_checked
        state.last_request = {
            "protocol": protocol,
            "model": body.get("model"),
            "images": [{k: v for k, v in i.items() if k != "bytes"} for i in images],
            "has_system": bool(body.get("system"))
            or any(m.get("role") == "system" for m in body.get("messages") or []),
            "sentences": len(prompt.sentences),
            "already_checked": prompt.already_checked,
            "description": prompt.description,
            "asks_description": prompt.asks_description,
            "cache_control": parts.breakpoints,
        }
        try:
            verdicts = state.oracle.verdicts(prompt.sentences, images_bytes)
        except ValueError as exc:  # the pixel judge without an inline image, or one it cannot decode
            return _error(protocol, 400, "invalid_request_error", str(exc))
        state.descriptions += prompt.asks_description
        return format_reply(*verdicts, prompt.sentences, checked, describe=prompt.asks_description), info

    async def answer(protocol: str, request: Request) -> tuple[str, dict[str, Any], Usage] | Response:
        """`judge`'s reply with its usage, after the token-timed part of the latency."""
        outcome = await judge(protocol, request)
        if isinstance(outcome, Response):
            return outcome
        reply, info = outcome
        account = anthropic_usage if protocol == "anthropic" else vllm_usage
        usage = account(state.caches[protocol], info["parts"].pieces, _tokens(reply))
        state.tokens.add(usage)
        if state.last_request is not None:
            state.last_request["usage"] = dataclasses.asdict(usage)
        extra = state.reply_seconds(usage) - state.latency_s  # the fixed part was slept already
        if extra > 0:
            await asyncio.sleep(extra)
        return reply, info, usage

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        outcome = await answer("anthropic", request)
        if isinstance(outcome, Response):
            return outcome
        reply, info, usage = outcome
        tokens: dict[str, int] = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
        if info["parts"].breakpoints:  # what the Messages API adds once a request uses the cache
            tokens |= {"cache_creation_input_tokens": usage.created, "cache_read_input_tokens": usage.cached}
        return {
            "id": f"msg_local_{next(state.ids)}",
            "type": "message",
            "role": "assistant",
            "model": info["model"],
            "content": [{"type": "text", "text": reply}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": tokens,
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        outcome = await answer("openai", request)
        if isinstance(outcome, Response):
            return outcome
        reply, info, usage = outcome
        return {
            "id": f"chatcmpl-local-{next(state.ids)}",
            "object": "chat.completion",
            "created": 0,
            "model": info["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": usage.prompt_tokens + usage.output_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cached},
            },
        }

    @app.get("/_stats")
    async def stats() -> dict[str, Any]:
        return {
            "requests": state.requests,
            "sentences_judged": state.sentences_judged,
            "by_protocol": dict(state.by_protocol),
            "last_request": state.last_request,
            "tokens": dataclasses.asdict(state.tokens),
            "descriptions": state.descriptions,
            "latency_model": state.latency_model(),
        }

    @app.post("/_control")
    async def control(change: Control) -> dict[str, Any]:
        if change.latency_s is not None:
            state.latency_s = change.latency_s
        if change.input_token_s is not None:
            state.input_token_s = change.input_token_s
        if change.output_token_s is not None:
            state.output_token_s = change.output_token_s
        if change.mode is not None:
            state.mode = change.mode
        if change.obey_checked is not None:
            state.obey_checked = change.obey_checked
        if change.reset_stats:
            state.reset()
        return state.public()

    return app


@contextlib.asynccontextmanager
async def running_judge_server(app: FastAPI, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve a `create_app` app on a free port of `host` in the current event loop; yields its URL.

    On exit every request a "hang" keeps waiting is released first, so the server stops at once.
    """
    async with running_app(app, host, on_exit=lambda: app.state.judge.release.set()) as url:
        yield url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    verdicts = parser.add_mutually_exclusive_group(required=True)
    verdicts.add_argument("--oracle", help="JSON file: {'unfaithful': [...], ...}")
    verdicts.add_argument("--shapesworld", action="store_true", help="judge ShapesWorld images by their pixels")
    parser.add_argument("--latency-s", type=float, default=0.0, help="fixed part of every reply's latency")
    parser.add_argument("--input-token-s", type=float, default=0.0, help="seconds per uncached prompt token")
    parser.add_argument("--output-token-s", type=float, default=0.0, help="seconds per output token")
    parser.add_argument("--image-tokens", type=int, default=IMAGE_TOKENS, help="prompt tokens per image")
    parser.add_argument("--mode", choices=["ok", "500", "429", "garbage", "badjson", "hang"], default="ok")
    args = parser.parse_args(argv)
    app = create_app(
        PixelJudge() if args.shapesworld else args.oracle,
        latency_s=args.latency_s,
        input_token_s=args.input_token_s,
        output_token_s=args.output_token_s,
        image_tokens=args.image_tokens,
    )
    app.state.judge.mode = args.mode
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", ws="none", timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
