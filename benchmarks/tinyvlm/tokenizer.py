"""A small byte-level BPE tokenizer in Qwen2's shape, trained offline on the fixture world's texts.

Same pre-tokenizer regex, NFC normalizer and byte-level decoder as Qwen2's tokenizer, the Qwen special
tokens (ids after the learned vocabulary), `<think>`/`</think>` as ordinary added tokens (not special:
vLLM keeps them in the text with `skip_special_tokens`), and the Qwen2-VL chat template. Training is
deterministic: the same corpus gives the same vocabulary and merges.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 1024  # learned tokens (bytes + merges); special and added tokens come on top

# Qwen2's split pattern: letters with one leading non-letter, single digits, punctuation runs, newlines.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
THINK_TOKENS = ["<think>", "</think>"]

# Qwen2-VL-Instruct's chat template, verbatim.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Some ordinary English so that text outside the fixture world still tokenizes into sensible pieces.
GENERIC_ENGLISH = """\
The picture shows a small house with a red door and two windows. A dog sleeps under the tree.
There are three apples on the table, and one of them is green. The sky is blue and clear today.
Count the objects one by one before you answer. Read the question carefully and look at the image.
A square has four equal sides and four corners. A triangle has three sides. A circle has no corners.
The cat is sitting to the right of the chair. The ball is smaller than the box.
First, describe what you see. Then, reason about it step by step. Finally, give the answer.
Which option is correct? Option A is wrong because the colour does not match. The answer is C.
She wrote the numbers 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 on the board and asked the students to add them.
Left, right, top, bottom, middle, centre, edge, corner, above, below, next to, between.
Red, orange, yellow, green, blue, purple, black, white, grey, brown, pink.
I think the man is holding an umbrella because it is raining. He wears a hat and a long coat.
What is in the image? How many people are there? Where is the car? Why is the light on?
"""


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """Trains the BPE on `texts` plus the chat template's text and some generic English."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    corpus = [*texts, *["system\nYou are a helpful assistant.\nuser\nassistant\n"] * 4, GENERIC_ENGLISH]
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=SPECIAL_TOKENS[3:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def fixture_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer of the fixture model (trained on every fixture prompt and completion)."""
    from faithproxy.benchmarks.tinyvlm.examples import corpus_texts

    return train_tokenizer(corpus_texts())
