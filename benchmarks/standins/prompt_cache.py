"""A model of how judge vendors count and bill prompt tokens with prompt caching, for the judge
stand-in (judge_server.py) and the judge-cost benchmark.

A prompt is counted at about four characters per token and IMAGE_TOKENS per image, as a list of
`Piece`s (one per text or image block). Two accountings:

- `anthropic_usage`, Anthropic's Messages API: a prefix ending at a block marked `cache_control` is
  stored; a later request reads the longest stored prefix that ends at one of its breakpoints or at
  any of the ANTHROPIC_LOOKBACK block boundaries before each; usage splits the prompt into read,
  written and plain input tokens.
- `vllm_usage`, vLLM's automatic prefix caching: every full block of VLLM_BLOCK tokens whose whole
  prefix was seen before is served from cache, whatever the request marks.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

CHARS_PER_TOKEN = 4
IMAGE_TOKENS = 800  # prompt tokens per image (a Qwen2.5-VL image of ~800x800 px; Claude's ~1000x600)
ANTHROPIC_LOOKBACK = 20  # block boundaries searched before each breakpoint
VLLM_BLOCK = 16  # tokens per prefix-cache block (vLLM's GPU default)
_CACHE_ENTRIES = 200_000


def tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Piece:
    """One block of a prompt as the cache sees it: its identity and its size in tokens."""

    key: str
    tokens: int
    cache: bool = False  # carries cache_control (Messages API)


def text_piece(text: str, cache: bool = False) -> Piece:
    return Piece("text:" + text, tokens(text), cache)


def image_piece(ident: str, size: int, cache: bool = False) -> Piece:
    return Piece("image:" + hashlib.sha256(ident.encode()).hexdigest(), size, cache)


@dataclass(frozen=True)
class Usage:
    """A reply's usage: the prompt split as the real APIs split it, and the output."""

    input_tokens: int  # not read from cache nor written to it
    output_tokens: int
    cached: int = 0
    created: int = 0

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cached + self.created


@dataclass
class TokenTotals:
    """What a server billed over its life."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_creation_tokens: int = 0
    output_tokens: int = 0

    def add(self, usage: Usage) -> None:
        self.input_tokens += usage.input_tokens
        self.cached_input_tokens += usage.cached
        self.cache_creation_tokens += usage.created
        self.output_tokens += usage.output_tokens


class PromptCache:
    """A bounded set of prompt-prefix hashes: what the emulated server has in its cache."""

    def __init__(self, entries: int = _CACHE_ENTRIES) -> None:
        self.entries = entries
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, key: bytes) -> bool:
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        return False

    def add(self, key: bytes) -> None:
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self.entries:
            self._seen.popitem(last=False)

    def clear(self) -> None:
        self._seen.clear()


def _chained(pieces: Sequence[str]) -> list[bytes]:
    """The hash of every prefix: element i covers pieces[0..i]."""
    out, digest = [], b""
    for piece in pieces:
        digest = hashlib.sha256(digest + piece.encode("utf-8", "surrogatepass")).digest()
        out.append(digest)
    return out


def anthropic_usage(cache: PromptCache, pieces: Sequence[Piece], output_tokens: int) -> Usage:
    """Anthropic's accounting: reads up to the furthest stored prefix found at a breakpoint or at one of
    the ANTHROPIC_LOOKBACK block boundaries before it, writes every breakpoint's prefix, and bills the
    tokens between the read and the last breakpoint as written, the rest as plain input."""
    hashes = _chained([p.key for p in pieces])
    ends = list(itertools.accumulate(p.tokens for p in pieces))
    marks = [i for i, p in enumerate(pieces) if p.cache]
    if not marks:
        return Usage(ends[-1] if ends else 0, output_tokens)
    read = -1
    for mark in marks:
        for i in range(mark, max(-1, mark - ANTHROPIC_LOOKBACK - 1), -1):
            if hashes[i] in cache:
                read = max(read, i)
                break
    for mark in marks:
        cache.add(hashes[mark])
    cached = ends[read] if read >= 0 else 0
    created = max(0, ends[marks[-1]] - cached)
    return Usage(ends[-1] - cached - created, output_tokens, cached=cached, created=created)


def vllm_usage(cache: PromptCache, pieces: Sequence[Piece], output_tokens: int) -> Usage:
    """vLLM's automatic prefix caching: the prompt as a token stream (text in 4-character tokens, an
    image as `tokens` copies of its hash), cut in VLLM_BLOCK-token blocks; leading full blocks whose
    whole prefix was seen are served from cache (never the last token: one is always computed)."""
    stream: list[str] = []
    for piece in pieces:
        if piece.key.startswith("text:"):
            text = piece.key[5:]
            stream += [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]
        else:
            stream += [piece.key] * piece.tokens
    total = len(stream)
    blocks = ["\x1f".join(stream[i : i + VLLM_BLOCK]) for i in range(0, total - total % VLLM_BLOCK, VLLM_BLOCK)]
    hashes = _chained(blocks)
    hit = 0
    while hit < len(hashes) and hashes[hit] in cache:
        hit += 1
    for digest in hashes:
        cache.add(digest)
    cached = min(hit * VLLM_BLOCK, max(0, total - 1))
    return Usage(max(1, total) - cached, output_tokens, cached=cached)
