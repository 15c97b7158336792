"""Giving a trained model the joined existence tokens ("red-square", `corpus.JOINED_TOKENS`) mid-run.

Why: see `questions.join_existence`. The tokens join the tokenizer as added tokens (the learned BPE
and every old id stay as they are) and the embedding and output matrices grow to hold them, rounded
up to a multiple of 64 rows (`config.vocab_rows`, as the model was built). A joined token starts as the mean of
its two words' rows ("Ġred", "Ġsquare") in both matrices, so the model first reads it as something
between the two words it stands for; rows past the tokenizer are zero and never used.

The resize is in place (`Parameter.data` is replaced, the Parameter object kept), so the optimizer's
hold on the two matrices survives; their AdamW moments grow with zero rows. A resumed run joins the
fresh model before loading a checkpoint from after the join, so that the shapes match.
"""

from __future__ import annotations

from typing import Any

import torch

from faithproxy.benchmarks.shapesworld.model.config import vocab_rows
from faithproxy.benchmarks.shapesworld.model.corpus import JOINED_TOKENS, add_joined_tokens


def join_vocab(model: Any, tokenizer: Any, optimizer: torch.optim.Optimizer | None = None) -> list[int]:
    """Adds the joined tokens to `tokenizer` and rows for them to `model` (and to `optimizer`'s
    moments, if it has any yet); returns the new tokens' ids. Refused if the tokenizer has them."""
    if JOINED_TOKENS[0] in tokenizer.get_vocab():
        raise ValueError("the tokenizer already has the joined tokens")
    words = [tokenizer.convert_tokens_to_ids(["\u0120" + w for w in token.split("-")]) for token in JOINED_TOKENS]
    if any(i == tokenizer.unk_token_id or i is None for pair in words for i in pair):
        raise ValueError("every colour and shape must be one token of the tokenizer")
    ids = add_joined_tokens(tokenizer)
    rows = vocab_rows(len(tokenizer))
    inputs = model.get_input_embeddings()
    outputs = model.get_output_embeddings()
    for param in (inputs.weight, outputs.weight):
        with torch.no_grad():
            grown = torch.zeros(max(rows, param.shape[0]), param.shape[1], dtype=param.dtype)
            grown[: param.shape[0]] = param
            for token_id, pair in zip(ids, words, strict=True):
                grown[token_id] = param[pair].mean(0)
        _pad_moments(optimizer, param, grown.shape[0])
        param.data = grown
    inputs.num_embeddings = outputs.out_features = inputs.weight.shape[0]
    model.config.text_config.vocab_size = inputs.weight.shape[0]
    return ids


def _pad_moments(optimizer: torch.optim.Optimizer | None, param: torch.nn.Parameter, rows: int) -> None:
    state = optimizer.state.get(param) if optimizer is not None else None
    for key in ("exp_avg", "exp_avg_sq"):
        if state and key in state:
            moment = state[key]
            state[key] = torch.cat([moment, moment.new_zeros(rows - moment.shape[0], *moment.shape[1:])])
