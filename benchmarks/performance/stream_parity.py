"""Client-visible parity: the same requests through this checkout and a baseline, byte for byte.

    .venv/bin/python -m faithproxy.benchmarks.performance.stream_parity --baseline SITE [--requests 12]

vLLM (CPU) serves the ShapesWorld model and a local pixel judge answers, as in cpu_per_token.py, whose
harness this reuses; two proxies run in front of them, this checkout and the faithproxy installed in SITE
(`pip install --no-deps --target SITE <checkout>`), each with a judge process of its own (the stand-in
models a prompt cache: a shared one would bill the second proxy's calls as cache reads). Every
configuration (off, correct with no detector, correct and detect with the judge; streamed and not) sends
each held-out question to both, one request at a time (greedy decoding, seeded rewrites: vLLM answers
alike), and compares what the client received: every SSE frame or the JSON body, with what differs by
nature removed (ids, `created`, timings; in detect mode, where verdict frames follow the judge's pace,
the text frames and the verdict frames are compared each in order, not their interleaving). It prints
the identical count per configuration and writes the differences; exit 1 when any differ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.performance.cpu_per_token import (
    CONFIGS,
    Config,
    Proxy,
    questions,
    request_body,
    start_pixel_judge,
    start_proxy,
)
from faithproxy.benchmarks.tinyvlm import processes

# Keys whose values differ between any two runs: response ids, clocks, and durations.
_VOLATILE = {"id", "created", "verification_s", "detector_latency_s", "latency_s", "duration_s", "ttft_s"}


def normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


async def received(http: httpx.AsyncClient, proxy: Proxy, config: Config, body: dict[str, Any]) -> list[Any]:
    """What the client got: the status, then each SSE frame (or the JSON body), normalised."""
    async with http.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, headers=config.headers) as r:
        raw = await r.aread()
    if not config.stream or not r.headers.get("content-type", "").startswith("text/event-stream"):
        return [r.status_code, normalise(json.loads(raw))]
    frames: list[Any] = []
    for line in raw.decode().split("\n\n"):
        if line.startswith("data: "):
            data = line[6:]
            frames.append(data if data == "[DONE]" else normalise(json.loads(data)))
    if config.mode == "detect":  # verdicts come when the judge answers: their place among the text varies
        verdicts = [f for f in frames if isinstance(f, dict) and "verdicts" in f.get("faithfulness", {})]
        frames = [f for f in frames if f not in verdicts] + ["verdicts:", *verdicts]
    return [r.status_code, *joined_text(frames)]


def _text_delta(frame: Any) -> tuple[str, str] | None:
    """(field, text) of a frame that carries only text, as vLLM streams a token or a few."""
    if not isinstance(frame, dict) or set(frame) - {"object", "model", "choices"} or len(frame["choices"]) != 1:
        return None
    choice = frame["choices"][0]
    delta = choice.get("delta") or {}
    if choice.get("finish_reason") is not None or len(delta) != 1:
        return None
    ((field, text),) = delta.items()
    return (field, text) if isinstance(text, str) else None


def joined_text(frames: list[Any]) -> list[Any]:
    """Runs of text-only frames of one field as one: how vLLM cuts its stream into chunks depends on when
    its output is read (under load, two tokens come as one chunk), which the proxy passes on as it is."""
    out: list[Any] = []
    for frame in frames:
        text, last = _text_delta(frame), _text_delta(out[-1]) if out else None
        if text is not None and last is not None and text[0] == last[0]:
            out[-1] = {**out[-1], "choices": [{**out[-1]["choices"][0], "delta": {text[0]: last[1] + text[1]}}]}
        else:
            out.append(frame)
    return out


async def compare(proxies: list[Proxy], model: str, count: int, max_tokens: int, out: Path) -> dict[str, list[int]]:
    items = questions(count)
    counts: dict[str, list[int]] = {}
    async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
        for config in CONFIGS:
            same = 0
            for i, (question, image) in enumerate(items):
                body = request_body(model, question, image, config.stream, max_tokens)
                after, before = [await received(http, p, config, body) for p in proxies]
                if after == before:
                    same += 1
                else:
                    name = f"{config.key.replace('/', '-')}-{i}.json"
                    (out / name).write_text(json.dumps({"after": after, "before": before}, indent=1))
            counts[config.key] = [same, len(items)]
            print(f"{config.key:28s} identical {same}/{len(items)}", flush=True)
    return counts


@processes.supervised()  # a signal or a failure stops every server started inside
def run(args: argparse.Namespace) -> dict[str, list[int]]:
    from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="faithproxy-parity-"))
    for folder in (workdir / "after", workdir / "before"):
        folder.mkdir(parents=True, exist_ok=True)
    started: list[processes.Child] = []
    try:
        vllm = start_vllm(WEIGHTS_DIR, log_path=workdir / "vllm.log")
        started.append(vllm.child)
        model = httpx.get(f"{vllm.base_url}/v1/models", trust_env=False).json()["data"][0]["id"]
        judges = [start_pixel_judge(workdir / name) for name in ("after", "before")]
        started += [judge for judge, _ in judges]
        proxies = [
            start_proxy("faithproxy", vllm.base_url, judges[0][1], workdir, None),
            start_proxy("faithproxy-before", vllm.base_url, judges[1][1], workdir, Path(args.baseline).resolve()),
        ]
        started += [p.child for p in proxies]
        for judge, judge_url in judges:
            judge.wait_healthy(f"{judge_url}/_stats", 60)
        for proxy in proxies:
            proxy.child.wait_healthy(f"{proxy.url}/readyz", 60)
        print(f"differences, if any, go to {workdir}", flush=True)
        return asyncio.run(compare(proxies, model, args.requests, args.max_tokens, workdir))
    finally:
        processes.stop_all(started)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stream_parity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", metavar="SITE", required=True, help="the faithproxy installed in SITE")
    parser.add_argument("--requests", type=int, default=12, help="held-out questions per configuration")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--workdir", help="logs and differences (default: a temporary folder)")
    counts = run(parser.parse_args(argv))
    return 0 if all(same == total for same, total in counts.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
