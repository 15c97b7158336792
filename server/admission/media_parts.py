"""The media of a request body, whichever door it came through: where each image (or video, audio) sits,
what it names (an http(s) URL, a data URL, inline base64) and how to write fetched bytes back.

Three shapes carry media:
- chat completions: `messages[i].content[j]` parts `{"type": "image_url", "image_url": {"url": ...}}`
  (or the bare-string form), `video_url`, `audio_url`;
- the Responses API: `input[i].content[j]` parts `{"type": "input_image", "image_url": "..."}`;
- Anthropic Messages: `messages[i].content[j]` blocks `{"type": "image", "source": {"type": "url" |
  "base64", ...}}`, also inside a `tool_result` block's content (off mode passes tools through, and an
  image URL there is fetched by vLLM like any other).

The limits (server/admission/limits.py `check_body`: count, size) and the image-URL policy
(server/admission/image_urls.py)
both read this one list, so a door cannot be added with its images unchecked.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# Chat's media part types and what each carries.
CHAT_MEDIA = {"image_url": "image", "video_url": "video", "audio_url": "audio"}


@dataclass
class MediaPart:
    """One image (video, audio) of a body. `url` is an http(s) or data URL, or None for inline base64
    (an Anthropic `base64` source, whose decoded size is `inline_size`)."""

    where: str  # messages[1].content[0].image_url, input[0].content[2].image_url, messages[0].content[1].source
    media: str  # image, video, audio
    url: str | None
    inline_size: int
    replace: Callable[[bytes, str], None]  # writes fetched bytes (and their media type) in place of the URL

    @property
    def size(self) -> int:
        """The decoded size of an inline image (a data URL or base64 data); 0 for an http(s) URL."""
        if self.url is None:
            return self.inline_size
        return data_url_size(self.url) if self.url.startswith("data:") else 0


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def data_url_size(url: str) -> int:
    """Decoded size of a base64 data URL, from its length alone."""
    comma = url.find(",")
    return 0 if comma < 0 else base64_size(url[comma + 1 :])


def base64_size(data: str) -> int:
    padding = 2 if data.endswith("==") else 1 if data.endswith("=") else 0
    return max(0, len(data) * 3 // 4 - padding)


def media_parts(body: dict[str, Any]) -> Iterator[MediaPart]:
    """Every media part of a chat, Responses or Anthropic Messages body, in order. Malformed parts are
    skipped: the door's own checks (or vLLM's, in `off`) say what is wrong with them."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for m, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            yield from _parts(content, f"messages[{m}].content")
    given = body.get("input")  # the Responses API: a string, or a list of input items
    if isinstance(given, list):
        for i, item in enumerate(given):
            content = item.get("content") if isinstance(item, dict) else None
            yield from _parts(content, f"input[{i}].content")


def _parts(content: Any, where: str) -> Iterator[MediaPart]:
    if not isinstance(content, list):
        return
    for p, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            continue
        kind = part["type"]
        if kind in CHAT_MEDIA:
            found = _chat_part(part, kind, f"{where}[{p}].{kind}")
        elif kind == "input_image":
            found = _responses_part(part, f"{where}[{p}].image_url")
        elif kind == "image":
            found = _anthropic_block(part, f"{where}[{p}].source")
        elif kind == "tool_result":
            yield from _parts(part.get("content"), f"{where}[{p}].content")
            continue
        else:
            continue
        if found is not None:
            yield found


def _chat_part(part: dict[str, Any], kind: str, where: str) -> MediaPart | None:
    spec = part.get(kind)
    if isinstance(spec, dict) and isinstance(spec.get("url"), str):
        holder, key = spec, "url"
    elif isinstance(spec, str):  # the bare-string form some clients send
        holder, key = part, kind
    else:
        return None

    def replace(data: bytes, media_type: str) -> None:
        holder[key] = data_url(data, media_type)

    return MediaPart(where, CHAT_MEDIA[kind], holder[key], 0, replace)


def _responses_part(part: dict[str, Any], where: str) -> MediaPart | None:
    url = part.get("image_url")
    if not isinstance(url, str):  # a file_id, or nothing: no URL to settle
        return None

    def replace(data: bytes, media_type: str) -> None:
        part["image_url"] = data_url(data, media_type)

    return MediaPart(where, "image", url, 0, replace)


def _anthropic_block(block: dict[str, Any], where: str) -> MediaPart | None:
    source = block.get("source")
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return MediaPart(where, "image", None, base64_size(source["data"]), lambda data, media_type: None)
    if source.get("type") != "url" or not isinstance(source.get("url"), str):
        return None

    def replace(data: bytes, media_type: str) -> None:
        block["source"] = {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode("ascii")}

    return MediaPart(where, "image", source["url"], 0, replace)
