"""The fixture spec as chat requests and the exact completions the fixture model must give for them.

One `Example` is one OpenAI chat request (messages with the image as a PNG data URL, the image always
before the text) plus its greedy completion. Training, the parity test and the demo all use these, so
the messages the model was trained on are the messages the proxy's callers send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.detectors.self_check_prompt import build_self_check_prompt
from faithproxy.regenerators.prompts import build_regeneration_prompt

FAITHFUL, UNFAITHFUL = "FAITHFUL", "UNFAITHFUL"


@dataclass(frozen=True)
class Example:
    key: str  # unique, e.g. "red_circle/chain"
    task: str  # chain | regeneration | continuation | self_check
    fixture: str
    messages: list[dict[str, Any]]
    target: str  # the completion text (the end-of-message token not included)

    @property
    def continue_final_message(self) -> bool:
        """Continuations end in a partial assistant message that the model extends."""
        return self.messages[-1]["role"] == "assistant"


def user_message(fixture: str, text: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": spec.data_url(fixture)}},
            {"type": "text", "text": text},
        ],
    }


def question_messages(fixture: spec.Fixture) -> list[dict[str, Any]]:
    return [user_message(fixture.name, fixture.question)]


def regeneration_messages(fixture: spec.Fixture, bad_sentence: str) -> list[dict[str, Any]]:
    prompt = build_regeneration_prompt(fixture.question, fixture.prefix, bad_sentence)
    return [user_message(fixture.name, prompt)]


def continuation_messages(fixture: spec.Fixture, sentence: str) -> list[dict[str, Any]]:
    partial = {"role": "assistant", "content": spec.partial_text(fixture, sentence)}
    return [*question_messages(fixture), partial]


def self_check_messages(fixture: spec.Fixture, prefix: list[str], sentence: str) -> list[dict[str, Any]]:
    return [user_message(fixture.name, build_self_check_prompt(fixture.question, prefix, sentence))]


def fixture_examples(fixture: spec.Fixture) -> list[Example]:
    name = fixture.name
    out = [Example(f"{name}/chain", "chain", name, question_messages(fixture), spec.chain_text(fixture))]
    for i, (bad, reply) in enumerate(fixture.regeneration):
        out.append(
            Example(f"{name}/regeneration/{i}", "regeneration", name, regeneration_messages(fixture, bad), f"[{reply}]")
        )
    if fixture.planted is not None:
        for rewrite in (fixture.rewrite_for(fixture.planted_sentence or ""), *fixture.rewrites):
            text = rewrite.sentence.text
            out.append(
                Example(
                    f"{name}/continuation/{text}",
                    "continuation",
                    name,
                    continuation_messages(fixture, text),
                    spec.continuation_text(rewrite),
                )
            )
    for i, (prefix, sentence) in enumerate(spec.self_check_cases(fixture)):
        verdict = FAITHFUL if sentence.faithful else UNFAITHFUL
        out.append(
            Example(
                f"{name}/self_check/{i}",
                "self_check",
                name,
                self_check_messages(fixture, prefix, sentence.text),
                verdict,
            )
        )
    return out


def all_examples() -> list[Example]:
    return [e for f in spec.FIXTURES for e in fixture_examples(f)]


def corpus_texts() -> list[str]:
    """Every prompt and completion text of the fixture world (the tokenizer is trained on these)."""
    texts = []
    for example in all_examples():
        for message in example.messages:
            content = message["content"]
            texts += [content] if isinstance(content, str) else [p["text"] for p in content if p["type"] == "text"]
        texts.append(example.target)
    return texts
