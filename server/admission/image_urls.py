"""Media URLs in a request, settled before anything is sent upstream, in every mode (`off` included).

vLLM fetches an `image_url` (and a `video_url` or `audio_url`) that names an http(s) URL itself, from
the vLLM host. Passed on unchecked, a client could make that host fetch `http://169.254.169.254/...`
or any internal service. What happens to such a URL is the `image_urls` setting
(`FAITHPROXY_IMAGE_URLS`):

- `fetch` (the default): the proxy fetches the image under its SSRF policy (`clients/image_fetch.py`:
  public addresses only, checked after DNS and again on every redirect, size and time limits) and
  sends vLLM, and the judge, the bytes as a data URL. An image the policy refuses or that cannot be
  fetched is a 400 whose message names the part (`messages[1].content[0].image_url`). Every door's
  images are settled: chat `image_url` parts, Responses `input_image` parts, Anthropic `image` blocks
  with a `url` source (server/admission/media_parts.py).
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
from typing import Any, Literal

from faithproxy.clients.image_fetch import ImageFetcher
from faithproxy.faithcore.errors import ImageRefused
from faithproxy.server.admission.media_parts import MediaPart, media_parts

ImageURLHandling = Literal["fetch", "refuse", "pass"]


def _refused(media: MediaPart, why: str, *, code: str = "image_refused") -> ImageRefused:
    # `param` stays "messages", as for every other image error; the message names the part.
    return ImageRefused(f"{media.where} ({_short(media.url or '')}): {why}", code=code)


def _scheme(url: str) -> str:
    head, sep, _ = url.partition(":")
    return head.strip().lower() if sep else ""


async def settle_media_urls(body: dict[str, Any], handling: ImageURLHandling, fetcher: ImageFetcher | None) -> bool:
    """Applies `handling` to every media URL of the body (any door's shape: server/admission/media_parts.py),
    replacing fetched images by inline data in place; True when the body changed (the caller re-encodes
    what it forwards). Raises ImageRefused (400) before anything has been sent upstream."""
    to_fetch: list[MediaPart] = []
    for media in media_parts(body):
        if media.url is None:  # inline base64 data
            continue
        scheme = _scheme(media.url)
        if scheme == "data":
            continue
        if scheme not in ("http", "https"):
            raise _refused(media, "media URLs must be data: or http(s) URLs")
        if handling == "pass":
            continue
        if media.media != "image":
            raise _refused(media, f"the proxy does not fetch {media.media} URLs; send the {media.media} as a data URL")
        if handling == "refuse":
            why = "this server does not accept image URLs; send the image as a data URL"
            raise _refused(media, why, code="image_url_not_allowed")
        to_fetch.append(media)
    if not to_fetch:
        return False
    if fetcher is None:  # create_app builds one whenever the setting is `fetch`
        raise RuntimeError("image_urls is 'fetch' but the app has no image fetcher")
    fetched = await _fetch_all(fetcher, to_fetch)
    for media, (data, media_type) in zip(to_fetch, fetched, strict=True):
        media.replace(data, media_type)
    return True


async def _fetch_all(fetcher: ImageFetcher, media: list[MediaPart]) -> list[tuple[bytes, str]]:
    """The images' bytes and media types, fetched side by side; the first refusal cancels the other fetches."""

    async def one(item: MediaPart) -> tuple[bytes, str]:
        assert item.url is not None
        try:
            return await fetcher.fetch(item.url)
        except ImageRefused as exc:
            raise _refused(item, exc.message, code=exc.code or "image_refused") from exc

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
