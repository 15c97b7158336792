"""What a judge request carries, read from either wire protocol the stand-in serves: its user text
(blocks joined as the judge backends join them), its images, and its prompt as cache pieces
(prompt_cache.py), in order. Images in data URLs are read with the product's own parser
(faithcore.images.parse_image_url)."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from faithproxy.benchmarks.standins.prompt_cache import Piece, image_piece, text_piece
from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.images import parse_image_url


@dataclass
class Parts:
    text: str
    images: list[dict[str, Any]]
    pieces: list[Piece]

    @property
    def breakpoints(self) -> int:
        return sum(1 for p in self.pieces if p.cache)


def anthropic_parts(body: dict[str, Any], image_tokens: int) -> Parts:
    """A Messages API request: `system` as a string or blocks, text and image blocks (cache_control
    marks a breakpoint)."""
    texts, images, pieces = [], [], []
    system = body.get("system")
    if isinstance(system, str) and system:
        pieces.append(text_piece(system))
    elif isinstance(system, list):
        pieces += [text_piece(b.get("text", ""), bool(b.get("cache_control"))) for b in system]
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            pieces.append(text_piece(content))
            continue
        for block in content or []:
            marked = bool(block.get("cache_control"))
            if block.get("type") == "text":
                texts.append(block.get("text", ""))
                pieces.append(text_piece(texts[-1], marked))
            elif block.get("type") == "image":
                source = block.get("source") or {}
                image = {"source": source.get("type"), "media_type": source.get("media_type")}
                if source.get("type") == "base64":
                    image["bytes"] = _b64(source.get("data"))
                images.append(image)
                pieces.append(image_piece(json.dumps(source, sort_keys=True), image_tokens, marked))
    return Parts("".join(texts), images, pieces)


def openai_parts(body: dict[str, Any], image_tokens: int) -> Parts:
    """A chat-completions request: system messages count in the prompt but not in the user text."""
    texts, images, pieces = [], [], []
    for message in body.get("messages") or []:
        content = message.get("content")
        system = message.get("role") == "system"
        if isinstance(content, str):
            pieces.append(text_piece(content))
            if not system:
                texts.append(content)
            continue
        for part in content or []:
            if part.get("type") == "text":
                pieces.append(text_piece(part.get("text", "")))
                if not system:
                    texts.append(part.get("text", ""))
            elif part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                images.append(_openai_image(url))
                pieces.append(image_piece(url, image_tokens))
    return Parts("".join(texts), images, pieces)


def _openai_image(url: str) -> dict[str, Any]:
    if not url.startswith("data:"):
        return {"source": "url"}
    try:
        ref = parse_image_url(url)
    except PolicyError as exc:
        raise ValueError(f"image data is not base64: {exc}") from None
    return {"source": "data", "bytes": base64.b64decode(ref.base64_data or "")}


def _b64(data: Any) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise ValueError(f"image data is not base64: {exc}") from None
