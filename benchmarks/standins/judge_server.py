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

Tokens and prompt caching, like the real servers (prompt_cache.py): the Messages API honours
`cache_control` (the usage then carries `cache_read_input_tokens` and `cache_creation_input_tokens`
beside `input_tokens`); the chat completions endpoint caches like vLLM's automatic prefix caching and
says so in `usage.prompt_tokens_details.cached_tokens`.

Latency follows a real VLM's token timing: `latency_s` (a fixed part: network, scheduling) plus
`input_token_s` per prompt token not served from cache (prefill) plus `output_token_s` per output token
(decode), all 0 by default.

A hint request of the proxy's collaborative hint inference (server/chain/hints.py) gets the fixed HINT_REPLY,
and the whole-chain evaluation prompt of `faithproxy bench judge-upr` a block per sentence with the
oracle's (or the pixels') labels.

`sentences_judged` counts the sentences each request asked about (context sentences excluded), so a
test or a benchmark sees batching as requests < sentences_judged.

Verdicts come from an oracle (oracle.py: the unfaithful sentences known in advance, `--oracle FILE`)
or from the image itself (`--shapesworld`: faithproxy.benchmarks.shapesworld.pixel_judge reads the inline image's
pixels; a request without an inline image gets a 400: point the proxy's judge at inline images, or let
it fetch http images, FAITHPROXY_JUDGE_FETCH_IMAGES). The request is read by judge_requests.py.

Fault modes (`--mode` or `/_control`): ok | 500 | 429 | garbage (a 200 reply with no judge fields) |
badjson (a 200 reply that is not JSON) | hang (no reply until the client gives up or the server stops).

    python -m faithproxy.benchmarks.standins.judge_server --port 8090 --oracle oracle.json --latency-s 0.5 \
        --input-token-s 0.0002 --output-token-s 0.02
    python -m faithproxy.benchmarks.standins.judge_server --port 8090 --shapesworld
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import math
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from faithproxy.benchmarks.evaluation.judge_upr import parse_evaluation_prompt
from faithproxy.benchmarks.standins.judge_requests import anthropic_parts, openai_parts
from faithproxy.benchmarks.standins.oracle import Oracle, Verdicts, format_evaluation, format_reply
from faithproxy.benchmarks.standins.prompt_cache import (
    IMAGE_TOKENS,
    PromptCache,
    TokenTotals,
    Usage,
    anthropic_usage,
    tokens,
    vllm_usage,
)
from faithproxy.detectors.judge_prompt import parse_judge_prompt_details
from faithproxy.testing import running_app

FailMode = Literal["ok", "500", "429", "garbage", "badjson", "hang"]
# Hint requests (collaborative hint inference) get this fixed reply: the server plays the auxiliary LLM.
HINT_REPLY = (
    "[Question type]: attribute\n[Topic hint]: Name each object by its shape and colour before comparing."
    "\n[Question hint]: Look at the object in the middle of the image first."
)
_FIELD_NAMES = re.compile(r"^\[(Question type|Topic hint|Question hint)\]:", re.MULTILINE)
_HINT_FIELDS = {"Question type", "Topic hint", "Question hint"}
GARBAGE_REPLY = "I am not sure what you would like me to do with this picture. Could you clarify?"


class Control(BaseModel):
    model_config = ConfigDict(extra="forbid")

    latency_s: float | None = Field(default=None, ge=0)
    input_token_s: float | None = Field(default=None, ge=0)
    output_token_s: float | None = Field(default=None, ge=0)
    mode: FailMode | None = None
    obey_checked: bool | None = None  # False: a disobedient judge that also reports checked sentences
    flag_confidence: float | None = Field(default=None, gt=0, lt=1)  # logprobs on OpenAI replies (see state)
    reset_stats: bool = False


@dataclass
class JudgeServerState:
    oracle: Verdicts
    latency_s: float = 0.0  # the fixed part of every reply's latency
    input_token_s: float = 0.0  # per prompt token not served from cache
    output_token_s: float = 0.0  # per output token
    mode: FailMode = "ok"
    obey_checked: bool = True
    # P(UNFAITHFUL) the OpenAI-protocol replies show in their log-probabilities when a request asks for
    # them (`logprobs`); None: none are given, as before (the judge's confidence is then unknown).
    flag_confidence: float | None = None
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
    """The judge server app; `oracle` may be an `Oracle`, its JSON mapping, a path to the file, or any
    other verdict source (the ShapesWorld `PixelJudge`). Latency: `latency_s` + `input_token_s` per
    uncached prompt token + `output_token_s` per output token."""
    if isinstance(oracle, str | Path):
        oracle = Oracle.load(oracle)
    elif isinstance(oracle, Mapping):
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
        info = {"model": body.get("model") or "local-judge", "parts": parts, "logprobs": bool(body.get("logprobs"))}
        if state.mode == "garbage":
            return GARBAGE_REPLY, info
        if _HINT_FIELDS.issubset(set(_FIELD_NAMES.findall(text))):  # a hint request (server/chain/hints.py)
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
        usage = account(state.caches[protocol], info["parts"].pieces, tokens(reply))
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
                    "logprobs": _logprobs(reply, state.flag_confidence) if info.get("logprobs") else None,
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
        if change.flag_confidence is not None:
            state.flag_confidence = change.flag_confidence
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
    if args.shapesworld:  # imported here: reading pixels needs the ShapesWorld libraries (numpy, pillow)
        from faithproxy.benchmarks.shapesworld.pixel_judge import PixelJudge

        verdicts: Verdicts | str = PixelJudge()
    else:
        verdicts = args.oracle
    app = create_app(
        verdicts,
        latency_s=args.latency_s,
        input_token_s=args.input_token_s,
        output_token_s=args.output_token_s,
        image_tokens=args.image_tokens,
    )
    app.state.judge.mode = args.mode
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", ws="none", timeout_graceful_shutdown=2)


def _logprobs(reply: str, confidence: float | None) -> dict[str, Any] | None:
    """OpenAI-format log-probabilities of a reply, one token per word or run of spaces: every token
    certain except the verdict of a flag, where UNFAITHFUL has `confidence` and FAITHFUL the rest."""
    if confidence is None:
        return None
    content = []
    for token in re.findall(r"\S+|\s+", reply):
        top = [{"token": token, "logprob": 0.0, "bytes": None}]
        if token == "UNFAITHFUL":
            top = [{"token": "UNFAITHFUL", "logprob": math.log(confidence), "bytes": None},
                   {"token": "FAITHFUL", "logprob": math.log(1 - confidence), "bytes": None}]  # fmt: skip
        content.append({"token": token, "logprob": top[0]["logprob"], "bytes": None, "top_logprobs": top})
    return {"content": content}


if __name__ == "__main__":
    main()
