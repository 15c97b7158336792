"""transformers' side of the fixture model: the prompt text for an example, and greedy generation.

Training encodes examples with these functions, and the parity test compares vLLM's output with
`greedy_reply`, so both render the chat exactly as vLLM does (chat template, image first, and for a
partial assistant message the rendering cut right after its text).
"""

from __future__ import annotations

from typing import Any

import torch

from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.benchmarks.tinyvlm.examples import Example


def prompt_text(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The chat rendered as vLLM renders it: a generation prompt, or the final assistant message continued."""
    continuing = messages[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=not continuing, continue_final_message=continuing
    )


def encode_prompt(processor: Any, example: Example) -> dict[str, torch.Tensor]:
    text = prompt_text(processor.tokenizer, example.messages)
    return processor(text=[text], images=[spec.load_image(example.fixture)], return_tensors="pt")


@torch.inference_mode()
def greedy_reply(model: Any, processor: Any, example: Example, max_new_tokens: int = 160) -> str:
    """transformers' greedy completion for the example's messages (special tokens dropped, as vLLM does)."""
    inputs = encode_prompt(processor, example)
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :]
    return processor.tokenizer.decode(new, skip_special_tokens=True)
