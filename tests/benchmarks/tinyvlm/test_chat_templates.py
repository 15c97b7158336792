"""The families' chat templates render what the real ones render: transcripts written down from the
published templates (Qwen2.5-VL-Instruct, Qwen3-VL-Thinking, GLM-4.1V-9B-Thinking) for a first turn, a
later turn with history, and a partial assistant message continued as vLLM continues it."""

from __future__ import annotations

from typing import Any

import pytest

from faithproxy.benchmarks.tinyvlm import chat_templates as t
from faithproxy.benchmarks.tinyvlm.train_formats import formats_tokenizer
from faithproxy.benchmarks.tinyvlm.train_formats import render as vllm_render

IMAGE = {"type": "image"}
FIRST = [{"role": "user", "content": [IMAGE, {"type": "text", "text": "Q"}]}]
HISTORY = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": [IMAGE, {"type": "text", "text": "Q1"}]},
    {"role": "assistant", "content": "R1\n</think>\n\nA1"},
    {"role": "user", "content": "Q2"},
]
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
GLM_IMAGE = "<|begin_of_image|><|image|><|end_of_image|>"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return formats_tokenizer()


def partial(text: str) -> list[dict[str, Any]]:
    return [*FIRST, {"role": "assistant", "content": text}]


def render(tokenizer: Any, template: str, messages: list[dict[str, Any]]) -> str:
    """The template applied to the messages as given (transformers, as the model cards show)."""
    continuing = messages[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=not continuing,
        continue_final_message=continuing,
    )


def test_qwen25_vl(tokenizer: Any) -> None:
    head = f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{QWEN_IMAGE}Q<|im_end|>\n"
    assert render(tokenizer, t.QWEN25_VL, FIRST) == head + "<|im_start|>assistant\n"
    assert render(tokenizer, t.QWEN25_VL, partial("R. A")) == head + "<|im_start|>assistant\nR. A"


QWEN3_FIRST = f"<|im_start|>user\n{QWEN_IMAGE}Q<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "template", [t.QWEN3_VL_THINKING, t.QWEN3_VL_THINKING_CONTINUABLE], ids=["stock", "continuable"]
)
def test_qwen3_vl_thinking(tokenizer: Any, template: str) -> None:
    # no default system prompt; the generation prompt opens the thinking
    assert render(tokenizer, template, FIRST) == QWEN3_FIRST + "<think>\n"
    # an earlier turn keeps its answer only: the thinking before the last question is dropped
    assert render(tokenizer, template, HISTORY) == (
        f"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n{QWEN_IMAGE}Q1<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    # a partial message whose thinking is closed is re-wrapped as the model wrote it
    assert render(tokenizer, template, partial("R.\n</think>\n\nA")) == QWEN3_FIRST + "<think>\nR.\n</think>\n\nA"
    assert render(tokenizer, template, partial("R.\n</think>\n\n")) == QWEN3_FIRST + "<think>\nR.\n</think>\n\n"


def test_qwen3_stock_cannot_leave_the_thinking_open(tokenizer: Any) -> None:
    # Cut inside the thinking, the last turn comes back with an empty think block before the text.
    assert render(tokenizer, t.QWEN3_VL_THINKING, partial("R.")) == QWEN3_FIRST + "<think>\n\n</think>\n\nR."
    assert render(tokenizer, t.QWEN3_VL_THINKING, partial("<think>\nR.")) == (
        QWEN3_FIRST + "<think>\n\n</think>\n\n<think>\nR."
    )
    # The continuable template renders that message as written: the prompt stays inside the thinking.
    assert render(tokenizer, t.QWEN3_VL_THINKING_CONTINUABLE, partial("<think>\nR.")) == QWEN3_FIRST + "<think>\nR."


def test_qwen3_continuable_differs_only_in_its_branch() -> None:
    assert (
        t.QWEN3_VL_THINKING_CONTINUABLE.replace(
            "{%- if loop.last and not add_generation_prompt and '<think>' in content and '</think>' not in content %}\n"
            "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
            "        {%- elif loop.index0 > ns.last_query_index %}",
            "{%- if loop.index0 > ns.last_query_index %}",
        )
        == t.QWEN3_VL_THINKING
    )


def test_glm_41v_thinking(tokenizer: Any) -> None:
    assert render(tokenizer, t.GLM41V_THINKING, FIRST) == f"[gMASK]<sop><|user|>\n{GLM_IMAGE}Q<|assistant|>\n"
    glm_history = [*HISTORY[:2], {"role": "assistant", "content": "<think>R1</think><answer>A1</answer>"}, HISTORY[3]]
    assert render(tokenizer, t.GLM41V_THINKING, glm_history) == (
        f"[gMASK]<sop><|system|>\nS<|user|>\n{GLM_IMAGE}Q1<|assistant|>\n<think>R1</think><answer>A1</answer>"
        "<|user|>\nQ2<|assistant|>\n"
    )
    # the assistant turn is rendered as written: a partial one continues exactly where it stops
    assert render(tokenizer, t.GLM41V_THINKING, partial("<think>R.")) == (
        f"[gMASK]<sop><|user|>\n{GLM_IMAGE}Q<|assistant|>\n<think>R."
    )


@pytest.mark.parametrize(
    "messages", [FIRST, HISTORY, partial("<think>R.</think><answer>A")], ids=["first", "history", "partial"]
)
def test_glm_with_qwen_vision_changes_only_the_placeholders(tokenizer: Any, messages: list[dict[str, Any]]) -> None:
    official = render(tokenizer, t.GLM41V_THINKING, messages)
    assert GLM_IMAGE in official
    assert render(tokenizer, t.GLM41V_THINKING_QWEN_VISION, messages) == official.replace(GLM_IMAGE, QWEN_IMAGE)


def test_vllm_must_hand_glm_strings(tokenizer: Any) -> None:
    """vLLM's default content format hands every content to the template as a list of parts; GLM's
    template prints an assistant message's content as it comes, so the model would see a Python list.
    With --chat-template-content-format string the continuation is the text as written (vLLM puts the
    image placeholder before the text, on its own line)."""
    messages = [{"role": "user", "content": [{"type": "image_url"}, {"type": "text", "text": "Q"}]}]
    messages.append({"role": "assistant", "content": "<think>R."})
    openai = vllm_render(tokenizer, t.GLM41V_THINKING_QWEN_VISION, messages, "openai")
    assert openai.endswith("<|assistant|>\n[{'type': 'text', 'text': '<think>R.")
    string = vllm_render(tokenizer, t.GLM41V_THINKING_QWEN_VISION, messages, "string")
    assert string == f"[gMASK]<sop><|user|>\n{QWEN_IMAGE}\nQ<|assistant|>\n<think>R."
