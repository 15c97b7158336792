"""A fast OpenAI-compatible upstream for the overhead benchmark: fixed chunks, no model.

A raw ASGI app (no framework) under uvicorn, so the upstream costs as little as possible and a proxy's
overhead stands out. It serves `POST /v1/chat/completions` (streamed and not), `GET /v1/models` and
`GET /health` (and `POST /bench/arm|release`, below), on 127.0.0.1 only.

Every proxy forwards the messages untouched, so the request controls the answer through its last
message's text: `chunks=N` (content chunks, default from the command line), `delay_ms=D` (a sleep
after each content chunk, default 0) and `hold` (after the first content chunk, wait while holding is
armed: from `POST /bench/arm` until `POST /bench/release`, at most `HOLD_LIMIT_S`; streams stay open
as long as a measurement needs). A stream is shaped like vLLM's: a role chunk, N content chunks, a
finish chunk, a usage chunk if `stream_options.include_usage`, then `data: [DONE]`. The content is
`expected_text(N)`, which the benchmark checks on every response.

    python -m faithproxy.benchmarks.standins.fast_upstream --port 8100 [--chunks 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from functools import lru_cache
from typing import Any

_WORDS = ("The", " red", " cube", " sits", " left", " of", " the", " blue", " sphere", ".")
_CHUNKS = re.compile(rb"chunks=(\d+)")
_DELAY = re.compile(rb"delay_ms=(\d+(?:\.\d+)?)")
_HOLD = re.compile(rb"\bhold\b")
MAX_CHUNKS = 10_000
HOLD_LIMIT_S = 120.0
CREATED = 1_700_000_000


def piece(i: int) -> str:
    return _WORDS[i % len(_WORDS)]


def expected_text(chunks: int) -> str:
    """The content every answer with `chunks` content chunks carries."""
    return "".join(piece(i) for i in range(chunks))


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _usage(chunks: int) -> dict[str, int]:
    return {"prompt_tokens": 16, "completion_tokens": chunks, "total_tokens": 16 + chunks}


@lru_cache(maxsize=256)
def stream_frames(model: str, chunks: int, include_usage: bool) -> tuple[bytes, ...]:
    """The whole event stream as frames, built once per shape (the hot path only sends bytes)."""
    frames = [_chunk(model, {"role": "assistant", "content": ""})]
    frames += [_chunk(model, {"content": piece(i)}) for i in range(chunks)]
    frames.append(_chunk(model, {}, finish="stop"))
    if include_usage:
        obj = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": CREATED, "model": model}
        obj |= {"choices": [], "usage": _usage(chunks)}
        frames.append(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")
    frames.append(b"data: [DONE]\n\n")
    return tuple(frames)


@lru_cache(maxsize=256)
def completion_body(model: str, chunks: int) -> bytes:
    obj = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": expected_text(chunks)},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(chunks),
    }
    return json.dumps(obj, separators=(",", ":")).encode()


def _control(body: dict[str, Any], default_chunks: int) -> tuple[int, float, bool]:
    messages = body.get("messages") or [{}]
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    content = last.get("content")
    text = json.dumps(content).encode() if not isinstance(content, str) else content.encode()
    chunks = int(m.group(1)) if (m := _CHUNKS.search(text)) else default_chunks
    delay = float(m.group(1)) / 1000 if (m := _DELAY.search(text)) else 0.0
    return min(chunks, MAX_CHUNKS), delay, bool(_HOLD.search(text))


class FastUpstream:
    """The ASGI app. `default_chunks` applies when a request names no `chunks=`."""

    def __init__(self, default_chunks: int = 8) -> None:
        self.default_chunks = default_chunks
        models = {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "bench"}]}
        self._models = json.dumps(models).encode()
        self._release = asyncio.Event()
        self._release.set()  # not armed
        self.holding = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path in ("/v1/models", "/models"):
            await _send_json(send, 200, self._models)
        elif method == "GET" and path == "/health":
            await _send_json(send, 200, b"{}")
        elif method == "POST" and path == "/bench/arm":
            if self._release.is_set():
                self._release = asyncio.Event()
            await _send_json(send, 200, b"{}")
        elif method == "POST" and path == "/bench/release":
            # Held streams go on, and streams that ask to be held from now on are not, until re-armed.
            held = self.holding
            self._release.set()
            await _send_json(send, 200, json.dumps({"released": held}).encode())
        elif method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            await self._chat(receive, send)
        else:
            await _send_json(send, 404, b'{"error":{"message":"not found","type":"not_found"}}')

    async def _chat(self, receive: Any, send: Any) -> None:
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            body = json.loads(raw)
        except ValueError:
            await _send_json(send, 400, b'{"error":{"message":"invalid JSON","type":"invalid_request_error"}}')
            return
        chunks, delay, hold = _control(body, self.default_chunks)
        model = str(body.get("model") or "fake")
        if not body.get("stream"):
            if delay:
                await asyncio.sleep(delay * chunks)
            await _send_json(send, 200, completion_body(model, chunks))
            return
        options = body.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")],
            }
        )
        # The first content chunk goes out at once; the delay follows each content chunk.
        for i, frame in enumerate(stream_frames(model, chunks, include_usage)):
            await send({"type": "http.response.body", "body": frame, "more_body": True})
            if hold and i == 1:
                await self._held()
            if delay and 1 <= i <= chunks:
                await asyncio.sleep(delay)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _held(self) -> None:
        self.holding += 1
        try:
            await asyncio.wait_for(self._release.wait(), HOLD_LIMIT_S)
        except TimeoutError:
            pass
        finally:
            self.holding -= 1


async def _send_json(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.standins.fast_upstream", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=8, help="content chunks when a request names none")
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(
        FastUpstream(args.chunks),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        ws="none",
        backlog=4096,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
