"""Multi-token frames (vLLM's `--stream-interval N`, issue 49): the answer does not depend on the cut.

With a stream interval each SSE chunk carries the text of N tokens, so a chunk can end mid-word, a
sentence end can fall inside a chunk ("...red circle. It is on"), the `</think>` between reasoning and
answer can fall inside a chunk (one delta then carries both `reasoning` and `content`, as vLLM's
reasoning parsers send it) and a completions stream can cut a think marker in two. The real proxy
(uvicorn) in front of a FakeUpstream whose chain is cut at one sentence per chunk (the reference), every
1, 7 and 23 characters, or not at all; the local judge flags the planted sentence, the fake's
regeneration corrects it and its continuation resumes after the corrected prefix (and refuses one that
is not a prefix of the corrected chain). Whatever the cut, the client gets the same text per channel,
the same steps (text, channel, kind, verdicts, rewrites: the stored report) and the same summary.

Chat completions: every cut in off, detect and correct; completions: off, detect and correct (its think
markers are in the text, so a cut splits them); Responses and Messages: detect and correct at cut 7
and the whole chain in one chunk (their off mode passes vLLM's own endpoint through unread, and the
fake serves neither). Sent at once, a round's frames all reach the machine before its first check, so
every cut makes the same batches; paced (a pause after each frame, as a real vLLM sends them), steps
are checked while later frames are on their way, so the cut changes the batches (chat, detect and
correct, with the judge gate off: see that test).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, as_annotated, completion, error_body, event, running_app, usage_chunk
from faithproxy.testing.answer import Answer, Pause, Step, Stream
from faithproxy.testing.wire import DONE, text_delta

PLANTED = "The circle has a thick blue border."
CORRECTED = "The circle has a thin black border."
# What the model writes, one sentence per piece: its thinking (a reasoning parser's `reasoning` field on
# the chat wire) and its answer; the think markers are only in a completions stream's text.
REASONING = [
    "The image shows a red circle. ",
    "It is 2.5 times as wide as the square. ",  # a period inside a sentence: a chunk may end at "2."
    f"{PLANTED} ",
    "So it must be red.\n",  # the lengths put the switch to content inside a frame at cuts 7 and 23
]
CONTENT = ['\n\nThe label in the image reads "RED." ', "The answer is red."]  # the end moves onto the quote
CUTS: list[int | str] = ["sentence", 1, 7, 23, "whole"]
QUESTION = "What colour is the shape?"
ASSISTANT = "<|assistant|>"  # where a completions prompt's model text starts
PACE_S = 0.001  # between paced frames: the reader waits for each, so the session checks steps meanwhile
ANSWERED_S = 30.0  # how long an answer may take: a bound for a hang, not a measurement


def model_text(reasoning: list[str]) -> list[tuple[str, str | None]]:
    """The model's output as pieces (text, field on the chat wire); None: a marker the parser drops."""
    first, *rest = reasoning
    return [("<think>", None), (first, "reasoning"), *((s, "reasoning") for s in rest), ("</think>", None)] + [
        (s, "content") for s in CONTENT
    ]


class CutChain:
    """The chain above, cut as the question's `cut=...` says (`paced`: PACE_S after each frame, else
    all at once); a regeneration answers CORRECTED; a continuation (a partial assistant message, or a
    completions prompt past ASSISTANT) resumes the corrected chain after the text it carries, cut the
    same way, and one that is not a prefix of the corrected chain is a 400."""

    model = "m"

    def stream(self, body: dict[str, Any]) -> Stream | Answer:
        completions = "prompt" in body
        asked = body["prompt"] if completions else json.dumps(body["messages"])
        match = re.search(r"cut=(\w+)( paced)?", asked)
        if match is None:
            return Answer.json(400, error_body("no cut in the question", "BadRequest"))
        cut, paced = match.group(1), match.group(2) is not None
        if completions:
            written = body["prompt"].split(ASSISTANT, 1)[1]
        else:
            last = body["messages"][-1]
            written = last["content"] if last["role"] == "assistant" else ""
        pieces = model_text([s.replace(PLANTED, CORRECTED) for s in REASONING] if written else REASONING)
        text = "".join(t for t, _ in pieces)
        if not text.startswith(written):
            return Answer.json(400, error_body(f"not a prefix of the corrected chain: {written!r}", "BadRequest"))
        # The characters the wire carries, each with its field (a reasoning parser drops the markers, a
        # completions stream has them in its text), cut as vLLM would: `cut=N` frames of N of them from
        # where this round starts.
        if completions:
            pieces = [(t, "text") for t, _ in pieces]
        wire = [(c, f) for t, f in pieces for c in t]
        start = sum(1 for _, f in wire[: len(written)] if f)
        chars = [(c, f) for c, f in wire if f]
        if cut == "sentence":
            ends = itertools.accumulate(len(t) if f else 0 for t, f in pieces)
            bounds = [start, *sorted({e for e in ends if e > start})]
        elif cut == "whole":
            bounds = [start, len(chars)]
        else:
            bounds = [*range(start, len(chars), int(cut)), len(chars)]
        frames: list[Step] = []
        for a, b in itertools.pairwise(bounds):
            parts: dict[str, str] = {}
            for c, f in chars[a:b]:
                parts[f] = parts.get(f, "") + c
            chunk = text_delta(parts["text"]) if completions else _chat_chunk(parts)
            frames += [event(chunk), Pause(PACE_S)] if paced else [event(chunk)]
        finish = text_delta("", "stop") if completions else _chat_chunk({}, "stop")
        return Stream((), tuple(frames), (event(finish), event(usage_chunk()), DONE))

    def reply(self, body: dict[str, Any]) -> Answer:
        return Answer.json(200, json.dumps(completion(f"[{CORRECTED}]")).encode())  # the reflect regenerator's


def _chat_chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "u1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


@contextlib.asynccontextmanager
async def proxy(**overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    judge_app = create_judge_app({"unfaithful": [PLANTED]})
    async with contextlib.AsyncExitStack() as stack:
        judge_url = await stack.enter_async_context(running_judge_server(judge_app))
        judge = JudgeConfig(name="j", backend="anthropic", model="judge-model", base_url=judge_url,
                            api_key="sk-test", timeout_s=ANSWERED_S, max_retries=0)  # type: ignore[arg-type]  # fmt: skip
        settings = Settings(upstream_url="http://vllm.test", judges=[judge], max_retries=1, **overrides)
        app = create_app(settings, upstream_transport=FakeUpstream(CutChain()).transport())
        url = await stack.enter_async_context(running_app(app))
        yield await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=ANSWERED_S))


def _events(body: str) -> list[dict[str, Any]]:
    """The JSON payload of each SSE event (with or without an `event:` line), [DONE] left out."""
    out = []
    for block in body.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def _chat(events: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any] | None]:
    deltas = [c["choices"][0].get("delta") or {} for c in events if c.get("choices")]
    summary = [c["faithfulness"] for c in events if "steps" in c.get("faithfulness", {})]
    reasoning = "".join(d.get("reasoning") or "" for d in deltas)
    return reasoning, "".join(d.get("content") or "" for d in deltas), summary[-1] if summary else None


def _completions(events: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any] | None]:
    summary = [c["faithfulness"] for c in events if "steps" in c.get("faithfulness", {})]
    text = "".join(c["choices"][0].get("text") or "" for c in events if c.get("choices"))
    return "", text, summary[-1] if summary else None


def _responses(events: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any] | None]:
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    content = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    [done] = [e["response"] for e in events if e["type"] == "response.completed"]
    return reasoning, content, done.get("faithfulness")


def _messages(events: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any] | None]:
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    reasoning = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
    content = "".join(d["text"] for d in deltas if d["type"] == "text_delta")
    [last] = [e for e in events if e["type"] == "message_delta"]
    return reasoning, content, last.get("faithfulness")


# door: (path, request body for a question, reader of its events)
DOORS = {
    "chat": ("/v1/chat/completions", lambda q: {"messages": [{"role": "user", "content": q}]}, _chat),
    "completions": ("/v1/completions", lambda q: {"prompt": f"<|user|>{q}{ASSISTANT}", "max_tokens": 99}, _completions),
    "responses": ("/v1/responses", lambda q: {"input": q}, _responses),
    "messages": ("/v1/messages", lambda q: {"messages": [{"role": "user", "content": q}], "max_tokens": 99}, _messages),
}


async def answer(http: httpx.AsyncClient, door: str, mode: str, cut: int | str, paced: bool = False) -> dict[str, Any]:
    """What the client got for the chain cut at `cut`: text per channel, steps (the report's) and summary."""
    path, body, read = DOORS[door]
    question = f"{QUESTION} (cut={cut}{' paced' if paced else ''})"
    response = await http.post(
        path, json={"model": "m", "stream": True, **body(question)}, headers={"x-faithproxy-mode": mode}
    )
    assert response.status_code == 200, (cut, response.text)
    events = _events(response.text)
    assert not [e for e in events if "error" in e or e.get("type") == "error"], (cut, response.text)
    reasoning, content, summary = read(events)
    got: dict[str, Any] = {"reasoning": reasoning, "content": content}
    if mode == "off":
        assert summary is None
        return got
    report = (await http.get(f"/v1/faithfulness/{response.headers['x-faithproxy-request-id']}")).json()
    assert summary is not None and as_annotated(report["faithfulness"]) == summary, cut
    got["steps"] = report["faithfulness"]["steps"]
    varying = ("verification_s", "judge")  # time, and the judge's bill (its calls follow the batching)
    got["summary"] = {k: v for k, v in summary.items() if k not in varying}
    return got


def expected_text(door: str, mode: str) -> tuple[str, str]:
    reasoning = "".join(REASONING)
    if mode == "correct":
        reasoning = reasoning.replace(PLANTED, CORRECTED)
    if door == "completions":  # no reasoning parser: the markers stay in the text
        return "", f"<think>{reasoning}</think>{''.join(CONTENT)}"
    return reasoning, "".join(CONTENT)


def check_reference(door: str, mode: str, got: dict[str, Any]) -> None:
    """The one-sentence-per-chunk answer is the right one (then the other cuts must equal it)."""
    assert (got["reasoning"], got["content"]) == expected_text(door, mode)
    if mode == "off":
        return
    sentences = [s.strip() for s in REASONING + CONTENT]
    if mode == "correct":
        sentences = [CORRECTED if s == PLANTED else s for s in sentences]
    steps = got["steps"]
    assert [s["text"] for s in steps] == sentences
    flagged = [s for s in steps if s["detected"] == "unfaithful"]
    assert [s.get("original_text", s["text"]) for s in flagged] == [PLANTED]
    if mode == "correct":
        assert flagged[0]["regenerated"] and flagged[0]["verdict"] == "faithful"
        assert got["summary"]["fixed"] == 1 and got["summary"]["residual"] == 0


async def same_answer_whatever_the_cut(
    http: httpx.AsyncClient, door: str, mode: str, cuts: list[int | str], paced: bool = False
) -> None:
    reference = await answer(http, door, mode, cuts[0], paced)
    check_reference(door, mode, reference)
    for cut in cuts[1:]:
        got = await answer(http, door, mode, cut, paced)
        for key in reference:
            assert got[key] == reference[key], f"cut={cut}: {key} differs"


@pytest.mark.parametrize(
    ("door", "mode", "cuts"),
    [
        ("chat", "off", CUTS),
        ("chat", "detect", CUTS),
        ("chat", "correct", CUTS),
        ("completions", "off", ["sentence", 7]),
        ("completions", "detect", ["sentence", 7]),
        ("completions", "correct", ["sentence", 1, 7]),
        ("responses", "detect", ["sentence", 7, "whole"]),
        ("responses", "correct", ["sentence", 7, "whole"]),
        ("messages", "detect", ["sentence", 7, "whole"]),
        ("messages", "correct", ["sentence", 7, "whole"]),
    ],
)
async def test_the_cut_of_the_stream_does_not_change_the_answer(door: str, mode: str, cuts: list[int | str]) -> None:
    """Frames sent at once, the default settings (the judge gate on)."""
    async with proxy() as http:
        await same_answer_whatever_the_cut(http, door, mode, cuts)


@pytest.mark.parametrize("mode", ["detect", "correct"])
async def test_paced_frames_give_the_same_answer_with_the_judge_gate_off(mode: str) -> None:
    """Paced frames: a bigger frame completes more steps per read, so it makes bigger batches (cut 1 here
    takes about 6 judge calls in detect, the whole chain 2). The judge gate is off: with it on, a step
    the step typer calls reasoning is judged (kind and verdict the judge's) when its batch holds a
    perception step and left `gated` when not (faithcore/correction/machine.py `_worth_checking`), so
    its verdict, and a judge's flag of it as an unfaithful perception step, follow the frame size and
    the timing (issue 49: reported, not fixed here)."""
    async with proxy(judge_every_step=True) as http:
        await same_answer_whatever_the_cut(http, "chat", mode, CUTS, paced=True)
