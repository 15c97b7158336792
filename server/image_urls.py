"""Media URLs in a request, settled before anything is sent upstream, in every mode (`off` included).

vLLM fetches an `image_url` (and a `video_url` or `audio_url`) that names an http(s) URL itself, from
the vLLM host. Passed on unchecked, a client could make that host fetch `http://169.254.169.254/...`
or any internal service. What happens to such a URL is the `image_urls` setting
(`FAITHPROXY_IMAGE_URLS`):

- `fetch` (the default): the proxy fetches the image under its SSRF policy (`clients/image_fetch.py`:
  public addresses only, checked after DNS and again on every redirect, size and time limits) and
  sends vLLM, and the judge, the bytes as a data URL. An image the policy refuses or that cannot be
  fetched is a 400 whose message names the part (`messages[1].content[0].image_url`).
- `refuse`: an http(s) image URL is a 400; clients must send data URLs.
- `pass`: URLs go to vLLM as the client sent them. Only for a vLLM started with
  `--allowed-media-domains` (and without `--allowed-local-media-path`), which then enforces its own
  list of hosts; the judge fetches under the proxy's policy only when configured with `fetch_images`.

Whatever the setting, a media URL must be a data URL or http(s) (a `file://` URL would read the vLLM
host's disk where vLLM allows local media), and video and audio are never fetched by the proxy:
an http(s) `video_url` or `audio_url` is refused unless the setting is `pass`.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from faithproxy.clients.image_fetch import ImageFetcher
from faithproxy.faithcore.errors import ImageRefused

ImageURLHandling = Literal["fetch", "refuse", "pass"]

_MEDIA_PARTS = {"image_url": "image", "video_url": "video", "audio_url": "audio"}


@dataclass
class _MediaURL:
    """One media part's URL and where it sits: messages[message].content[part].<type>."""

    message: int
    part: int
    kind: str  # the part type: image_url, video_url, audio_url
    url: str
    holder: dict[str, Any]  # the part, or its {"url": ...} object: what the data URL is written into
    key: str  # the key under `holder` that holds the URL

    @property
    def where(self) -> str:
        return f"messages[{self.message}].content[{self.part}].{self.kind}"

    def refused(self, why: str, *, code: str = "image_refused") -> ImageRefused:
        # `param` stays "messages", as for every other image error; the message names the part.
        return ImageRefused(f"{self.where} ({_short(self.url)}): {why}", code=code)


def _media_urls(messages: list[dict[str, Any]]) -> Iterator[_MediaURL]:
    for m, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str) or part["type"] not in _MEDIA_PARTS:
                continue
            kind = part["type"]
            spec = part.get(kind)
            if isinstance(spec, dict) and isinstance(spec.get("url"), str):
                yield _MediaURL(m, p, kind, spec["url"], spec, "url")
            elif isinstance(spec, str):  # the bare-string form some clients send
                yield _MediaURL(m, p, kind, spec, part, kind)
            # anything else is malformed: the checking modes say so (400), vLLM does in `off`


def _scheme(url: str) -> str:
    head, sep, _ = url.partition(":")
    return head.strip().lower() if sep else ""


async def settle_media_urls(body: dict[str, Any], handling: ImageURLHandling, fetcher: ImageFetcher | None) -> bool:
    """Applies `handling` to every media URL of `body["messages"]`, replacing fetched images by data
    URLs in place; True when the body changed (the caller re-encodes what it forwards). Raises
    ImageRefused (400) before anything has been sent upstream."""
    to_fetch: list[_MediaURL] = []
    for media in _media_urls(body.get("messages") or []):  # a completions prompt has none
        scheme = _scheme(media.url)
        if scheme == "data":
            continue
        if scheme not in ("http", "https"):
            raise media.refused("media URLs must be data: or http(s) URLs")
        if handling == "pass":
            continue
        if media.kind != "image_url":
            what = _MEDIA_PARTS[media.kind]
            raise media.refused(f"the proxy does not fetch {what} URLs; send the {what} as a data URL")
        if handling == "refuse":
            raise media.refused(
                "this server does not accept image URLs; send the image as a data URL", code="image_url_not_allowed"
            )
        to_fetch.append(media)
    if not to_fetch:
        return False
    if fetcher is None:  # create_app builds one whenever the setting is `fetch`
        raise RuntimeError("image_urls is 'fetch' but the app has no image fetcher")
    data_urls = await _fetch_all(fetcher, to_fetch)
    for media, data_url in zip(to_fetch, data_urls, strict=True):
        media.holder[media.key] = data_url
    return True


async def _fetch_all(fetcher: ImageFetcher, media: list[_MediaURL]) -> list[str]:
    """The images as data URLs, fetched side by side; the first refusal cancels the other fetches."""

    async def one(item: _MediaURL) -> str:
        try:
            data, media_type = await fetcher.fetch(item.url)
        except ImageRefused as exc:
            raise item.refused(exc.message, code=exc.code or "image_refused") from exc
        return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(item)) for item in media]
    except ExceptionGroup as failed:
        refusals = [exc for exc in failed.exceptions if isinstance(exc, ImageRefused)]
        if len(refusals) != len(failed.exceptions):
            raise  # a bug, not a refusal: keep every traceback
        raise refusals[0] from None
    return [task.result() for task in tasks]


def _short(url: str, limit: int = 120) -> str:
    if url.startswith("data:"):
        return "data URL"
    return url if len(url) <= limit else url[: limit - 3] + "..."
