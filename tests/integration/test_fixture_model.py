"""The fixture model, served by real vLLM, says what `tinyvlm.fixture_spec` promises (real openai SDK).

(a) the chain for every image and question, planted errors included; (b) the regeneration reply;
(c) the continuation after the corrected sentence with `continue_final_message`; (d) the self-check
verdicts; and parity: vLLM's greedy text equals transformers' greedy `generate` for every request.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from faithproxy.benchmarks.tinyvlm import examples as ex
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.detectors.self_check_prompt import parse_self_check
from faithproxy.regenerators.prompts import parse_bracketed

pytestmark = pytest.mark.integration

PLANTED = [f for f in spec.FIXTURES if f.planted is not None]
ALL_EXAMPLES = ex.all_examples()


def ids(fixtures: Iterable[spec.Fixture]) -> list[str]:
    return [f.name for f in fixtures]


@pytest.fixture(scope="module")
def client(vllm_server: Any) -> Iterator[Any]:
    import openai

    with openai.OpenAI(base_url=vllm_server.openai_base_url, api_key="unused", max_retries=0) as c:
        yield c


def complete(client: Any, model: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """Greedy completion text; a trailing assistant message is continued, as the proxy does."""
    if messages[-1]["role"] == "assistant":
        kwargs["extra_body"] = {"continue_final_message": True, "add_generation_prompt": False}
    response = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=200, **kwargs)
    return response.choices[0].message.content or ""


def test_spec_is_consistent() -> None:
    spec.validate()
    assert spec.FAILING_REGENERATION in ids(PLANTED)


@pytest.mark.parametrize("fixture", spec.FIXTURES, ids=ids(spec.FIXTURES))
def test_chain(client: Any, vllm_server: Any, fixture: spec.Fixture) -> None:
    text = complete(client, vllm_server.model, ex.question_messages(fixture))
    assert text == spec.chain_text(fixture)
    if fixture.planted_sentence is not None:
        assert fixture.planted_sentence in text
        assert text.endswith(spec.answer_text(fixture.answer)) and fixture.answer != fixture.correct_answer


def test_same_question_different_images_different_chains(client: Any, vllm_server: Any) -> None:
    by_question: dict[str, set[str]] = {}
    for fixture in spec.FIXTURES:
        text = complete(client, vllm_server.model, ex.question_messages(fixture))
        by_question.setdefault(fixture.question, set()).add(text)
    counts = {q: sum(f.question == q for f in spec.FIXTURES) for q in by_question}
    assert {q: len(texts) for q, texts in by_question.items()} == counts


@pytest.mark.parametrize("fixture", PLANTED, ids=ids(PLANTED))
def test_regeneration(client: Any, vllm_server: Any, fixture: spec.Fixture) -> None:
    assert fixture.planted_sentence is not None and fixture.correction is not None
    reply = complete(client, vllm_server.model, ex.regeneration_messages(fixture, fixture.planted_sentence))
    assert reply == fixture.regeneration_reply
    rewritten = parse_bracketed(reply)
    if fixture.regeneration_succeeds:
        assert rewritten == fixture.correction.sentence.text
        return
    # The failing fixture: every try, fed back its own previous answer, stays unfaithful.
    unfaithful = spec.oracle_json()["unfaithful"]
    flagged = fixture.planted_sentence
    for _ in range(3):
        reply = complete(client, vllm_server.model, ex.regeneration_messages(fixture, flagged))
        rewritten = parse_bracketed(reply)
        assert rewritten is not None and rewritten in unfaithful
        flagged = rewritten


@pytest.mark.parametrize("fixture", PLANTED, ids=ids(PLANTED))
def test_continuation_after_correction(client: Any, vllm_server: Any, fixture: spec.Fixture) -> None:
    correction = fixture.correction
    assert correction is not None
    messages = ex.continuation_messages(fixture, correction.sentence.text)
    text = complete(client, vllm_server.model, messages)
    assert text == spec.continuation_text(correction)
    full = messages[-1]["content"] + text
    assert full == spec.corrected_chain_text(fixture)
    assert full.endswith(spec.answer_text(fixture.correct_answer))


def test_continuation_after_every_trained_rewrite(client: Any, vllm_server: Any) -> None:
    for example in (e for e in ALL_EXAMPLES if e.task == "continuation"):
        assert complete(client, vllm_server.model, example.messages) == example.target, example.key


@pytest.mark.parametrize("fixture", spec.FIXTURES, ids=ids(spec.FIXTURES))
def test_self_check(client: Any, vllm_server: Any, fixture: spec.Fixture) -> None:
    for prefix, sentence in spec.self_check_cases(fixture):
        reply = complete(client, vllm_server.model, ex.self_check_messages(fixture, prefix, sentence.text))
        assert parse_self_check(reply) is sentence.faithful, (prefix, sentence)


def test_streamed_equals_non_streamed(client: Any, vllm_server: Any) -> None:
    fixture = spec.get("red_circle")
    for messages in (ex.question_messages(fixture), ex.continuation_messages(fixture, "The circle is red.")):
        extra = {}
        if messages[-1]["role"] == "assistant":
            extra = {"extra_body": {"continue_final_message": True, "add_generation_prompt": False}}
        stream = client.chat.completions.create(
            model=vllm_server.model, messages=messages, temperature=0, max_tokens=200, stream=True, **extra
        )
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert streamed == complete(client, vllm_server.model, messages)


def _prefix_cache_hits(base_url: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total")
    )


def test_continuation_reuses_cached_prefix(client: Any, vllm_server: Any) -> None:
    """With 32-token KV blocks the continuation hits the blocks its chain request left in the cache."""
    fixture = spec.get("square_and_circle")
    assert fixture.correction is not None
    complete(client, vllm_server.model, ex.question_messages(fixture))
    before = _prefix_cache_hits(vllm_server.base_url)
    complete(client, vllm_server.model, ex.continuation_messages(fixture, fixture.correction.sentence.text))
    assert _prefix_cache_hits(vllm_server.base_url) - before >= 32


def test_a_kept_step_read_to_the_think_close_continues_to_the_answer(client: Any, vllm_server: Any) -> None:
    """The correction machine over vLLM's own stream, the check held until the stream has read the think
    block's close (as a slow judge would): the planted step is flagged, its one try fails, the step is
    kept, and the round the machine then asks for, sent to vLLM, writes the answer. The client gets the
    chain exactly as the model wrote it. (A CI run lost this answer: the round used to continue from the
    bare last step, and from there this model ends its reply at once.)"""
    from faithproxy.faithcore import correction as c
    from faithproxy.faithcore.types import Faithfulness, Verdict

    fixture = spec.get(spec.FAILING_REGENERATION)
    planted = fixture.planted_sentence
    core = c.new_machine(c.Rules("correct", "judge", max_retries=1))
    held: list[c.Check] = []
    sent: list[str] = []
    rounds: list[c.StartRound] = []
    ends: list[c.EmitEnd] = []

    def take() -> None:
        while not ends and (action := core.next_action()) is not c.WAIT:
            if isinstance(action, c.Check):
                held.append(action)
            elif isinstance(action, c.Regenerate):
                core.receive(c.Regenerated("The shape is a circle."))  # the model's own failing try
            elif isinstance(action, c.EmitText):
                sent.append(action.text)
            elif isinstance(action, c.StartRound):
                rounds.append(action)
            elif isinstance(action, c.EmitEnd):
                ends.append(action)

    def answer_held() -> None:
        while held:
            check = held.pop(0)
            bad = {planted, "The shape is a circle."}
            core.receive(c.Checked([Verdict(Faithfulness.UNFAITHFUL if s.text in bad else Faithfulness.FAITHFUL,
                                          "judge") for s in check.steps]))  # fmt: skip
            take()

    take()
    stream = client.chat.completions.create(
        model=vllm_server.model, messages=ex.question_messages(fixture), temperature=0, max_tokens=200, stream=True
    )
    read = ""
    for chunk in stream:
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            read += text
            core.receive(c.Delta("content", text))
            take()
        if "</think>" in read:
            break
    stream.close()
    answer_held()
    assert len(rounds) == 2 and rounds[1].continuation is not None
    partial = rounds[1].continuation.content
    assert partial.startswith("<think>\n") and partial.rstrip("\n").endswith("corners.\n</think>"), partial
    question = ex.question_messages(fixture)
    rest = complete(client, vllm_server.model, [*question, {"role": "assistant", "content": partial}])
    core.receive(c.Delta("content", rest))
    core.receive(c.RoundEnd("stop", None))
    take()
    answer_held()
    assert "".join(sent) == spec.chain_text(fixture) and [e.finish_reason for e in ends] == ["stop"]
    # the cut the machine used to make: this model writes nothing more from there
    bare = partial[: partial.index("\n</think>")]
    assert complete(client, vllm_server.model, [*question, {"role": "assistant", "content": bare}]) == ""


# --- parity with transformers -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_model(fixture_model_dir: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    torch.set_num_threads(2)
    processor = AutoProcessor.from_pretrained(fixture_model_dir)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(fixture_model_dir, dtype=torch.float32).eval()
    return model, processor


def test_prompt_tokens_match_transformers(client: Any, vllm_server: Any, hf_model: tuple[Any, Any]) -> None:
    """vLLM renders and tokenizes each chat exactly as transformers does (image tokens included)."""
    from faithproxy.benchmarks.tinyvlm.hf_reference import encode_prompt

    _, processor = hf_model
    for example in ALL_EXAMPLES:
        extra_body: dict[str, Any] = {"return_token_ids": True}
        if example.continue_final_message:
            extra_body |= {"continue_final_message": True, "add_generation_prompt": False}
        response = client.chat.completions.create(
            model=vllm_server.model, messages=example.messages, temperature=0, max_tokens=1, extra_body=extra_body
        )
        expected = encode_prompt(processor, example)["input_ids"][0].tolist()
        assert response.model_dump()["prompt_token_ids"] == expected, example.key


@pytest.mark.parametrize("task", ["chain", "regeneration", "continuation", "self_check"])
def test_vllm_matches_transformers(client: Any, vllm_server: Any, hf_model: tuple[Any, Any], task: str) -> None:
    from faithproxy.benchmarks.tinyvlm.hf_reference import greedy_reply

    model, processor = hf_model
    for example in (e for e in ALL_EXAMPLES if e.task == task):
        vllm_text = complete(client, vllm_server.model, example.messages)
        assert vllm_text == greedy_reply(model, processor, example), example.key
