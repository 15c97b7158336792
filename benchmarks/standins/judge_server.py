"""A local judge server with an oracle, speaking both judge wire protocols.

Tests, the demo and the benchmarks need a judge that is real on the wire (the official anthropic and
openai SDKs talk to it unchanged) but whose answers are known in advance. This server reads our judge
prompt back (`parse_judge_prompt_details`), asks an ORACLE which sentences are unfaithful, and replies
in the judge format of `detectors/judge_prompt.py`, like an obedient judge: sentences marked as checked
before are never reported.

    POST /v1/messages           Anthropic Messages API (non-streaming)
    POST /v1/chat/completions   OpenAI chat completions (non-streaming)
    GET  /_stats                {"requests", "sentences_judged", "by_protocol", "last_request"}
    POST /_control              {"latency_s"?, "mode"?, "obey_checked"?, "reset_stats"?} -> state

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

    python -m faithproxy.benchmarks.standins.judge_server --port 8090 --oracle oracle.json --latency-s 0.5
    python -m faithproxy.benchmarks.standins.judge_server --port 8090 --shapesworld
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import itertools
import json
import re
from collections.abc import AsyncIterator, Iterable, Mapping
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

    def reply(self, sentences: list[str], already_checked: int = 0) -> str:
        """The judge-format reply an obedient, perfect judge would give."""
        return format_reply(*self.verdicts(sentences, []), sentences, already_checked)

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
    description: str, kinds: list[StepKind], unfaithful: list[bool], sentences: list[str], already_checked: int = 0
) -> str:
    """Our judge reply format (detectors/judge_prompt.py); sentences before `already_checked` are not
    reported, as an obedient judge does with sentences the proxy marks as checked."""
    first = next((i for i in range(already_checked, len(sentences)) if unfaithful[i]), None)
    lines = [f"[Image description]: {description}"]
    lines += [f"Sentence {i}: {kind.name}" for i, kind in enumerate(kinds, start=1)]
    if first is None:
        prefix = f"1-{len(sentences)}" if sentences else "none"
        lines += ["[Faithfulness]: FAITHFUL", f"[Faithful reasoning chain prefix]: {prefix}"]
        lines.append("[First unfaithful sentence]:")
    else:
        prefix = f"1-{first}" if first else "none"
        lines += ["[Faithfulness]: UNFAITHFUL", f"[Faithful reasoning chain prefix]: {prefix}"]
        lines.append(f"[First unfaithful sentence]: Sentence {first + 1}: {sentences[first]}")
    return "\n".join(lines)


Verdicts = Oracle | PixelJudge


class Control(BaseModel):
    model_config = ConfigDict(extra="forbid")

    latency_s: float | None = Field(default=None, ge=0)
    mode: FailMode | None = None
    obey_checked: bool | None = None  # False: a disobedient judge that also reports checked sentences
    reset_stats: bool = False


@dataclass
class JudgeServerState:
    oracle: Verdicts
    latency_s: float = 0.0
    mode: FailMode = "ok"
    obey_checked: bool = True
    hang_s: float = 300.0
    requests: int = 0
    sentences_judged: int = 0
    by_protocol: dict[str, int] = field(default_factory=lambda: {"anthropic": 0, "openai": 0})
    last_request: dict[str, Any] | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends every "hang" at shutdown
    ids: itertools.count = field(default_factory=itertools.count)

    def public(self) -> dict[str, Any]:
        return {"latency_s": self.latency_s, "mode": self.mode, "obey_checked": self.obey_checked}


def _anthropic_parts(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    texts, images = [], []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        for block in content or []:
            if block.get("type") == "text":
                texts.append(block.get("text", ""))
            elif block.get("type") == "image":
                source = block.get("source") or {}
                image = {"source": source.get("type"), "media_type": source.get("media_type")}
                if source.get("type") == "base64":
                    image["bytes"] = _b64(source.get("data"))
                images.append(image)
    return "\n".join(texts), images


def _openai_parts(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    texts, images = [], []
    for message in body.get("messages") or []:
        if message.get("role") == "system":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        for part in content or []:
            if part.get("type") == "text":
                texts.append(part.get("text", ""))
            elif part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                image = {"source": "data" if url.startswith("data:") else "url"}
                if url.startswith("data:"):
                    image["bytes"] = _b64(url.partition(",")[2])
                images.append(image)
    return "\n".join(texts), images


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


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def create_app(oracle: Verdicts | Mapping[str, Any] | str | Path, latency_s: float = 0.0) -> FastAPI:
    """The judge server app; `oracle` may be an `Oracle`, its JSON mapping, a path to the file, or a
    `PixelJudge`."""
    if isinstance(oracle, str | Path):
        oracle = Oracle.load(oracle)
    elif not isinstance(oracle, Oracle | PixelJudge):
        oracle = Oracle.from_mapping(oracle)
    state = JudgeServerState(oracle=oracle, latency_s=latency_s)

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
            text, images = (_anthropic_parts if protocol == "anthropic" else _openai_parts)(body)
        except (ValueError, AttributeError, TypeError):
            return _error(protocol, 400, "invalid_request_error", "body is not a chat request")
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
        info = {"model": body.get("model") or "local-judge", "input": _tokens(text)}
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
            "image_hint": prompt.image_hint,
        }
        try:
            reply = format_reply(*state.oracle.verdicts(prompt.sentences, images_bytes), prompt.sentences, checked)
        except ValueError as exc:  # the pixel judge without an inline image, or one it cannot decode
            return _error(protocol, 400, "invalid_request_error", str(exc))
        return reply, info

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        outcome = await judge("anthropic", request)
        if isinstance(outcome, Response):
            return outcome
        reply, info = outcome
        return {
            "id": f"msg_local_{next(state.ids)}",
            "type": "message",
            "role": "assistant",
            "model": info["model"],
            "content": [{"type": "text", "text": reply}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": info["input"], "output_tokens": _tokens(reply)},
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        outcome = await judge("openai", request)
        if isinstance(outcome, Response):
            return outcome
        reply, info = outcome
        output = _tokens(reply)
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
                "prompt_tokens": info["input"],
                "completion_tokens": output,
                "total_tokens": info["input"] + output,
            },
        }

    @app.get("/_stats")
    async def stats() -> dict[str, Any]:
        return {
            "requests": state.requests,
            "sentences_judged": state.sentences_judged,
            "by_protocol": dict(state.by_protocol),
            "last_request": state.last_request,
        }

    @app.post("/_control")
    async def control(change: Control) -> dict[str, Any]:
        if change.latency_s is not None:
            state.latency_s = change.latency_s
        if change.mode is not None:
            state.mode = change.mode
        if change.obey_checked is not None:
            state.obey_checked = change.obey_checked
        if change.reset_stats:
            state.requests = state.sentences_judged = 0
            state.by_protocol = {"anthropic": 0, "openai": 0}
            state.last_request = None
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
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--mode", choices=["ok", "500", "429", "garbage", "badjson", "hang"], default="ok")
    args = parser.parse_args(argv)
    app = create_app(PixelJudge() if args.shapesworld else args.oracle, latency_s=args.latency_s)
    app.state.judge.mode = args.mode
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", ws="none", timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
