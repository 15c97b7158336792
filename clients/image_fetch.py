"""Fetching the http(s) images clients name, under an SSRF policy.

By default the server fetches every http(s) image URL of a request itself and sends vLLM and the
judge the bytes (server/admission/image_urls.py), so that no URL chosen by a client is fetched from the vLLM
host unchecked; with URLs passed through, a judge configured with `fetch_images: true` still gets
the bytes this way. The proxy then fetches URLs chosen by its clients, which makes it an SSRF target;
every hop is therefore checked:

1. the scheme is in `schemes`, the URL has no user info, the host matches `allowed_hosts` (if set);
2. the host is resolved first and EVERY address it resolves to must be public (not private, loopback,
   link-local, multicast, reserved, unspecified, shared or documentation space; IPv4 embedded in
   IPv6 is checked as IPv4), unless it lies in one of `allow_networks`;
3. the connection goes to the address that was checked (the URL's host is replaced by it; the Host
   header and TLS SNI/certificate check keep the name), so a second DNS answer cannot differ
   (no DNS rebinding); connections are never reused across fetches for the same reason;
4. redirects are followed by hand, each target checked again from step 1, at most `max_redirects`;
5. the reply must be 200 with an image media type from `media_types`, at most `max_bytes` bytes,
   and the whole fetch (DNS, redirects, body) must finish within `timeout_s`.

Environment proxies are ignored (`trust_env=False`): a proxy would resolve the name itself. A refused
or failed fetch is an `ImageRefused` (HTTP 400) naming the image, raised before anything is sent
upstream. The resolver is injectable so tests can map names to private addresses without traffic.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import httpx
from pydantic import BaseModel, ConfigDict, Field, IPvAnyNetwork

from faithproxy.faithcore.errors import ImageRefused
from faithproxy.faithcore.images import ImageRef

Resolver = Callable[[str, int], Awaitable[list[str]]]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_REDIRECTS = {301, 302, 303, 307, 308}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_MiB = 1024 * 1024


class FetchPolicy(BaseModel):
    """What the proxy may fetch when a client names an image by URL (`FAITHPROXY_IMAGE_FETCH__*`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schemes: tuple[str, ...] = ("http", "https")
    # Exact host names, or "*.example.com" for any subdomain; None: any host (addresses still checked).
    allowed_hosts: tuple[str, ...] | None = None
    # Networks allowed even though they are not public, e.g. ["127.0.0.0/8"] or ["10.1.2.0/24"].
    allow_networks: tuple[IPvAnyNetwork, ...] = ()
    # The judges' vendors accept these; SVG and friends are refused.
    media_types: tuple[str, ...] = ("image/png", "image/jpeg", "image/gif", "image/webp")
    max_bytes: int = Field(default=20 * _MiB, gt=0)
    timeout_s: float = Field(default=10.0, gt=0)
    max_redirects: int = Field(default=3, ge=0, le=10)


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, in the resolver's order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_public(ip: IPAddress) -> bool:
    """True for addresses on the public internet; IPv6 that embeds IPv4 (mapped, 6to4, Teredo, NAT64)
    is judged by the IPv4 address it leads to."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded: IPAddress | None = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip.teredo is not None:
            embedded = ip.teredo[1]
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public(embedded)
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or (isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local)
    )


def address_allowed(ip: IPAddress, policy: FetchPolicy) -> bool:
    return any(ip in network for network in policy.allow_networks) or is_public(ip)


def host_allowed(host: str, policy: FetchPolicy) -> bool:
    if policy.allowed_hosts is None:
        return True
    host = host.lower().rstrip(".")
    for pattern in policy.allowed_hosts:
        pattern = pattern.lower().rstrip(".")
        if pattern.startswith("*.") and host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
            return True
        if host == pattern:
            return True
    return False


class ImageFetcher:
    """Fetches images under a `FetchPolicy`; one per server, built in the lifespan. Its HTTP client
    is made on the first fetch, so a server whose clients send no image URLs never holds one.

    `transport` replaces the network (tests); `resolver` replaces DNS (tests map names to private
    addresses with it, so no packet ever leaves the machine).
    """

    def __init__(
        self,
        policy: FetchPolicy,
        *,
        resolver: Resolver | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.policy = policy
        self._resolve = resolver or system_resolver
        self._transport = transport
        self._http: httpx.AsyncClient | None = None

    @property
    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = self._new_client()
        return self._http

    def _new_client(self) -> httpx.AsyncClient:
        policy = self.policy
        return httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(policy.timeout_s),
            # A pooled connection is keyed by address: reusing one for another name would skip that
            # name's certificate check.
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=0),
            headers={
                "accept": ", ".join(policy.media_types),
                # Raw bytes are counted against max_bytes: no compression, so no decompression bomb.
                "accept-encoding": "identity",
                "user-agent": "faithproxy-image-fetch",
            },
            transport=self._transport,
        )

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def fetch_all(self, images: Sequence[ImageRef]) -> list[ImageRef]:
        """The images with every http(s) one replaced by its fetched bytes (concurrently); data URLs
        are kept as they are."""
        fetched = await asyncio.gather(
            *(self.fetch_ref(image, position) for position, image in enumerate(images, start=1))
        )
        return list(fetched)

    async def fetch_ref(self, image: ImageRef, position: int = 1) -> ImageRef:
        if image.is_data_url:
            return image
        try:
            data, media_type = await self.fetch(image.url)
        except ImageRefused as exc:
            raise ImageRefused(f"image {position} ({_short(image.url)}): {exc.message}", code=exc.code or "") from exc
        b64 = base64.b64encode(data).decode("ascii")
        # The hash stays the one of the URL: traces and the judge's description cache do not change
        # with the fetch setting.
        return replace(
            image, url=f"data:{media_type};base64,{b64}", media_type=media_type, base64_data=b64, source_url=image.url
        )

    async def fetch(self, url: str) -> tuple[bytes, str]:
        """The bytes and media type of the image at `url`; `ImageRefused` when the policy refuses it."""
        try:
            async with asyncio.timeout(self.policy.timeout_s):
                return await self._fetch(httpx.URL(url))
        except TimeoutError:
            limit = f"{self.policy.timeout_s:g} s"
            raise ImageRefused(f"fetching the image took longer than {limit}", code="image_fetch_failed") from None
        except httpx.InvalidURL as exc:
            raise ImageRefused(f"invalid image URL: {exc}") from exc

    async def _fetch(self, url: httpx.URL) -> tuple[bytes, str]:
        for _ in range(self.policy.max_redirects + 1):
            addresses = await self._check(url)
            response = await self._connect(url, addresses)
            try:
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    url = url.join(response.headers["location"])
                    continue
                return await self._read(response)
            finally:
                await response.aclose()
        raise ImageRefused(f"more than {self.policy.max_redirects} redirects")

    async def _check(self, url: httpx.URL) -> list[IPAddress]:
        """The addresses to connect to, all allowed; refuses the URL otherwise."""
        policy = self.policy
        if url.scheme not in policy.schemes:
            raise ImageRefused(f"scheme '{url.scheme}' is not allowed (allowed: {', '.join(policy.schemes)})")
        if url.userinfo:
            raise ImageRefused("image URLs with user info are not allowed")
        host = url.host
        if not host:
            raise ImageRefused("the image URL has no host")
        if not host_allowed(host, policy):
            raise ImageRefused(f"host '{host}' is not in the allowed image hosts")
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                resolved = await self._resolve(host, port)
                addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolved]
            except (OSError, ValueError, UnicodeError) as exc:
                raise ImageRefused(f"cannot resolve host '{host}'", code="image_fetch_failed") from exc
        if not addresses:
            raise ImageRefused(f"cannot resolve host '{host}'", code="image_fetch_failed")
        # Every address: a name with one public and one private address must not be a way in.
        if not all(address_allowed(a, policy) for a in addresses):
            raise ImageRefused(f"host '{host}' resolves to an address the image fetch policy does not allow")
        return addresses

    async def _connect(self, url: httpx.URL, addresses: list[IPAddress]) -> httpx.Response:
        """Sends the request to the first checked address that accepts a connection."""
        last: Exception | None = None
        for address in addresses:
            pinned = url.copy_with(host=str(address))
            headers = {"host": url.netloc.decode("ascii")}
            extensions = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else {}
            request = self._client.build_request("GET", pinned, headers=headers, extensions=extensions)
            try:
                return await self._client.send(request, stream=True)
            except httpx.ConnectError as exc:
                last = exc
            except httpx.HTTPError as exc:
                raise ImageRefused(f"cannot fetch the image: {type(exc).__name__}", code="image_fetch_failed") from exc
        raise ImageRefused(
            f"cannot fetch the image: {type(last).__name__ if last else 'no address'}", code="image_fetch_failed"
        )

    async def _read(self, response: httpx.Response) -> tuple[bytes, str]:
        policy = self.policy
        if response.status_code != 200:
            raise ImageRefused(f"the image URL answered HTTP {response.status_code}", code="image_fetch_failed")
        media_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type not in policy.media_types:
            raise ImageRefused(f"content type '{media_type or 'none'}' is not an allowed image type")
        if response.headers.get("content-encoding", "identity").lower() != "identity":
            raise ImageRefused("compressed image replies are not accepted")
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
            raise ImageRefused(f"the image is larger than {policy.max_bytes} bytes", code="image_too_large")
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes():  # identity only: these are the raw bytes
                size += len(chunk)
                if size > policy.max_bytes:
                    raise ImageRefused(f"the image is larger than {policy.max_bytes} bytes", code="image_too_large")
                chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise ImageRefused(f"cannot fetch the image: {type(exc).__name__}", code="image_fetch_failed") from exc
        return b"".join(chunks), media_type


def _short(url: str, limit: int = 120) -> str:
    return url if len(url) <= limit else url[: limit - 3] + "..."
