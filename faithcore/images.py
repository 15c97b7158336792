"""Image references found in OpenAI chat messages, hashed once per request.

Data URLs are decoded only to hash their bytes; the original base64 text is kept so judges receive it
without re-encoding. http(s) URLs are kept as URLs (hashed by their text) and passed on as such, unless
the judge wants bytes: then `clients/image_fetch.py` fetches them (under its SSRF policy) into an
ImageRef that carries a data URL, keeping the hash of the original URL.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Any

from faithproxy.faithcore.errors import PolicyError


@dataclass(frozen=True)
class ImageRef:
    """One image of the conversation. `url` is what a judge is given: the client's URL, or a data URL
    built from fetched bytes (then `source_url` is the client's http(s) URL)."""

    url: str
    sha256: str
    media_type: str | None = None  # for data URLs
    base64_data: str | None = None  # for data URLs: the payload exactly as the client sent it (or fetched)
    source_url: str | None = None  # for fetched images: the http(s) URL the bytes came from

    @property
    def is_data_url(self) -> bool:
        return self.base64_data is not None


def parse_image_url(url: str) -> ImageRef:
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep or ";base64" not in header:
            raise PolicyError("image_url data URLs must be base64 encoded", param="messages")
        media_type = header[5:].split(";", 1)[0] or "application/octet-stream"
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise PolicyError(f"image_url data URL is not valid base64: {exc}", param="messages") from exc
        return ImageRef(url=url, sha256=hashlib.sha256(raw).hexdigest(), media_type=media_type, base64_data=payload)
    if url.startswith(("http://", "https://")):
        return ImageRef(url=url, sha256=hashlib.sha256(url.encode()).hexdigest())
    raise PolicyError("image_url must be a data: URL or an http(s) URL", param="messages")


def images_in_messages(messages: list[dict[str, Any]]) -> list[ImageRef]:
    """Every image of the conversation, in order of appearance."""
    found: list[ImageRef] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                spec = part.get("image_url")
                url = spec.get("url") if isinstance(spec, dict) else spec
                if not isinstance(url, str):
                    raise PolicyError("image_url part without a url", param="messages")
                found.append(parse_image_url(url))
    return found


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user message: the question the chain answers."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(
                p["text"]
                for p in content
                if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            )
    return ""


def image_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The image_url parts of the conversation, as the client sent them, for calls that re-show the image
    to the generator (regeneration, self-checks): passed on untouched, never re-encoded."""
    parts: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts.extend(p for p in content if isinstance(p, dict) and p.get("type") == "image_url")
    return parts
