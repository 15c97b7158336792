"""SSRF-safe image fetching for judges (clients/image_fetch.py).

Only 127.0.0.1 is ever contacted: a real image server there (allowed explicitly in the positive tests,
refused by default in the negative ones). Names that resolve to private or public addresses come from
an injected resolver, and where the fetch would go on to such an address the network is an
httpx.MockTransport, so no packet leaves the machine.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import hashlib
import ipaddress
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.clients.image_fetch import FetchPolicy, ImageFetcher, host_allowed, is_public
from faithproxy.clients.judges import JudgeConfig
from faithproxy.faithcore.errors import ImageRefused
from faithproxy.faithcore.images import parse_image_url
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, running_app

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
LOOPBACK = FetchPolicy(allow_networks=("127.0.0.0/8",))  # type: ignore[arg-type]
# The limit of a call expected to be answered (the judge's, the client's): one no loaded machine reaches; it
# bounds a hang, it measures nothing.
ANSWERED_S = 30.0


def image_server() -> FastAPI:
    app = FastAPI()
    app.state.hits = []
    # /slow.png answers only once the test sets this: a fetch that ends before then ended on its own clock.
    app.state.release_slow = asyncio.Event()

    @app.middleware("http")
    async def record(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        app.state.hits.append((request.url.path, request.headers.get("host")))
        return await call_next(request)

    @app.get("/red.png")
    async def red() -> Response:
        return Response(PNG, media_type="image/png")

    @app.get("/big.png")
    async def big() -> Response:
        return Response(bytes(50_000), media_type="image/png")

    @app.get("/big-chunked.png")
    async def big_chunked() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(50):
                yield bytes(1000)

        return StreamingResponse(body(), media_type="image/png")

    @app.get("/slow.png")
    async def slow() -> Response:
        await app.state.release_slow.wait()
        return Response(PNG, media_type="image/png")

    @app.get("/page.html")
    async def page() -> PlainTextResponse:
        return PlainTextResponse("<html></html>", media_type="text/html")

    @app.get("/logo.svg")
    async def svg() -> Response:
        return Response(b"<svg/>", media_type="image/svg+xml")

    @app.get("/gzip.png")
    async def gzipped() -> Response:
        return Response(gzip.compress(PNG), media_type="image/png", headers={"content-encoding": "gzip"})

    @app.get("/missing.png")
    async def missing() -> Response:
        return Response(status_code=404)

    @app.get("/redirect")
    async def redirect(to: str) -> RedirectResponse:
        return RedirectResponse(to, status_code=302)

    return app


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, FastAPI]]:
    app = image_server()
    async with running_app(app) as url:
        yield url, app


def resolver(table: dict[str, list[str]]) -> Callable[[str, int], Awaitable[list[str]]]:
    async def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError(f"no such host {host}")
        return table[host]

    return resolve


def no_network(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"a refused fetch reached the network: {request.url}")


@contextlib.asynccontextmanager
async def fetcher(policy: FetchPolicy = LOOPBACK, **kwargs: Any) -> AsyncIterator[ImageFetcher]:
    f = ImageFetcher(policy, **kwargs)
    try:
        yield f
    finally:
        await f.aclose()


async def refused(f: ImageFetcher, url: str) -> ImageRefused:
    with pytest.raises(ImageRefused) as info:
        await f.fetch(url)
    assert info.value.status_code == 400 and info.value.param == "messages"
    return info.value


# ---- the positive path ------------------------------------------------------------------------


async def test_loopback_allowed_explicitly_fetches(server: tuple[str, FastAPI]) -> None:
    url, _ = server
    async with fetcher() as f:
        assert await f.fetch(f"{url}/red.png") == (PNG, "image/png")


async def test_connects_to_the_checked_address_and_keeps_the_name(server: tuple[str, FastAPI]) -> None:
    url, app = server
    port = httpx.URL(url).port
    asked: list[str] = []

    async def resolve(host: str, p: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    async with fetcher(resolver=resolve) as f:
        assert (await f.fetch(f"http://images.test:{port}/red.png"))[0] == PNG
    assert asked == ["images.test"]  # resolved once, by us; the connection went to 127.0.0.1
    assert app.state.hits == [("/red.png", f"images.test:{port}")]


async def test_https_is_pinned_with_sni_of_the_name() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=PNG, headers={"content-type": "image/png"})

    async with fetcher(
        FetchPolicy(), resolver=resolver({"img.example": ["93.184.216.34"]}), transport=httpx.MockTransport(handler)
    ) as f:
        await f.fetch("https://img.example/cat.png?x=1")
    (request,) = seen
    assert request.url.host == "93.184.216.34" and request.url.path == "/cat.png" and request.url.query == b"x=1"
    assert request.headers["host"] == "img.example"
    assert request.extensions["sni_hostname"] == "img.example"


# ---- addresses --------------------------------------------------------------------------------

PRIVATE = [
    "127.0.0.1",
    "10.1.2.3",
    "172.16.0.9",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "100.64.0.1",  # shared address space
    "0.0.0.0",
    "224.0.0.1",  # multicast
    "240.0.0.1",  # reserved
    "255.255.255.255",
    "192.0.2.1",  # documentation
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "ff02::1",
    "::ffff:10.0.0.1",  # IPv4-mapped
    "2002:a00:1::1",  # 6to4 of 10.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2001:db8::1",
]


@pytest.mark.parametrize("address", PRIVATE)
async def test_names_resolving_to_non_public_addresses_are_refused(address: str) -> None:
    async with fetcher(
        FetchPolicy(), resolver=resolver({"internal.test": [address]}), transport=httpx.MockTransport(no_network)
    ) as f:
        error = await refused(f, "http://internal.test/a.png")
    assert error.code == "image_refused" and "does not allow" in error.message
    assert address not in error.message  # internal addressing is not echoed to the client


@pytest.mark.parametrize("address", PRIVATE)
def test_is_public(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


@given(value=st.integers(min_value=0, max_value=2**128 - 1))
def test_is_public_takes_any_address(value: int) -> None:
    ip = ipaddress.ip_address(value) if value < 2**32 else ipaddress.IPv6Address(value)
    if is_public(ip):
        assert ip.is_global and not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast)


async def test_every_address_of_a_name_must_be_allowed() -> None:
    table = {"mixed.test": ["93.184.216.34", "10.0.0.1"]}
    async with fetcher(FetchPolicy(), resolver=resolver(table), transport=httpx.MockTransport(no_network)) as f:
        await refused(f, "http://mixed.test/a.png")


async def test_loopback_is_refused_by_default(server: tuple[str, FastAPI]) -> None:
    url, app = server
    async with fetcher(FetchPolicy(), resolver=resolver({"localhost": ["127.0.0.1"]})) as f:
        await refused(f, f"{url}/red.png")
        await refused(f, f"http://localhost:{httpx.URL(url).port}/red.png")
    assert app.state.hits == []


async def test_allow_networks_is_exact() -> None:
    policy = FetchPolicy(allow_networks=("10.1.0.0/16",))  # type: ignore[arg-type]
    table = {"ok.test": ["10.1.2.3"], "no.test": ["10.2.0.1"]}
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url.host))
        return httpx.Response(200, content=PNG, headers={"content-type": "image/png"})

    async with fetcher(policy, resolver=resolver(table), transport=httpx.MockTransport(handler)) as f:
        await f.fetch("http://ok.test/a.png")
        await refused(f, "http://no.test/a.png")
    assert seen == ["10.1.2.3"]


# ---- redirects --------------------------------------------------------------------------------


async def test_redirect_to_an_internal_name_is_refused(server: tuple[str, FastAPI]) -> None:
    url, app = server
    async with fetcher(resolver=resolver({"metadata.test": ["169.254.169.254"]})) as f:
        error = await refused(f, f"{url}/redirect?to=http://metadata.test/latest/meta-data/")
    assert "metadata.test" in error.message
    assert [path for path, _ in app.state.hits] == ["/redirect"]


async def test_redirect_to_a_literal_private_address_is_refused() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "93.184.216.34":
            return httpx.Response(301, headers={"location": "http://10.0.0.1/secret.png"})
        raise AssertionError("followed the redirect")

    async with fetcher(
        FetchPolicy(), resolver=resolver({"pub.test": ["93.184.216.34"]}), transport=httpx.MockTransport(handler)
    ) as f:
        await refused(f, "http://pub.test/a.png")


async def test_allowed_redirects_are_followed_up_to_the_limit(server: tuple[str, FastAPI]) -> None:
    url, _ = server
    once = f"{url}/redirect?to=/red.png"
    async with fetcher() as f:
        assert (await f.fetch(once))[0] == PNG
    twice = f"{url}/redirect?to=" + quote("/redirect?to=/red.png", safe="/")
    async with fetcher(FetchPolicy(allow_networks=LOOPBACK.allow_networks, max_redirects=1)) as f:
        error = await refused(f, twice)
    assert "redirects" in error.message


# ---- replies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/big.png", "/big-chunked.png"])
async def test_size_limit(server: tuple[str, FastAPI], path: str) -> None:
    url, _ = server
    async with fetcher(FetchPolicy(allow_networks=LOOPBACK.allow_networks, max_bytes=10_000)) as f:
        error = await refused(f, f"{url}{path}")
    assert error.code == "image_too_large"


async def test_time_limit(server: tuple[str, FastAPI]) -> None:
    """The server holds its reply until the test releases it, so the fetch can only end by the policy's
    timeout, however slow the machine (no elapsed time is compared)."""
    url, app = server
    try:
        async with fetcher(FetchPolicy(allow_networks=LOOPBACK.allow_networks, timeout_s=0.3)) as f:
            error = await refused(f, f"{url}/slow.png")
        assert error.code == "image_fetch_failed" and "longer than 0.3 s" in error.message
        assert not app.state.release_slow.is_set()
    finally:
        app.state.release_slow.set()  # the handler ends now, not at the server's shutdown


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("/page.html", "image_refused", "content type 'text/html'"),
        ("/logo.svg", "image_refused", "image/svg+xml"),
        ("/gzip.png", "image_refused", "compressed"),
        ("/missing.png", "image_fetch_failed", "HTTP 404"),
    ],
)
async def test_bad_replies(server: tuple[str, FastAPI], path: str, code: str, words: str) -> None:
    url, _ = server
    async with fetcher() as f:
        error = await refused(f, f"{url}{path}")
    assert error.code == code and words in error.message


async def test_connection_refused_is_a_fetch_failure() -> None:
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with fetcher() as f:
        error = await refused(f, f"http://127.0.0.1:{port}/a.png")
    assert error.code == "image_fetch_failed"


# ---- URLs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://127.0.0.1/a.png", "scheme 'ftp'"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("http://user:pw@127.0.0.1/a.png", "user info"),
        ("http://unknown.test/a.png", "cannot resolve"),
        ("http://[::1/a.png", "invalid image URL"),
    ],
)
async def test_bad_urls(url: str, words: str) -> None:
    async with fetcher(resolver=resolver({}), transport=httpx.MockTransport(no_network)) as f:
        error = await refused(f, url)
    assert words in error.message


async def test_https_only_policy() -> None:
    async with fetcher(FetchPolicy(schemes=("https",)), transport=httpx.MockTransport(no_network)) as f:
        await refused(f, "http://img.example/a.png")


async def test_host_allowlist() -> None:
    policy = FetchPolicy(allowed_hosts=("images.example.com", "*.cdn.example"))
    async with fetcher(policy, resolver=resolver({}), transport=httpx.MockTransport(no_network)) as f:
        error = await refused(f, "http://evil.example/a.png")
    assert "not in the allowed image hosts" in error.message
    assert host_allowed("images.example.com", policy) and host_allowed("IMAGES.example.com.", policy)
    assert host_allowed("a.cdn.example", policy) and host_allowed("a.b.cdn.example", policy)
    assert not host_allowed("cdn.example", policy) and not host_allowed("evilcdn.example", policy)
    assert not host_allowed("images.example.com.evil", policy)


# ---- ImageRefs --------------------------------------------------------------------------------


async def test_fetch_all_inlines_http_images_and_keeps_data_urls(server: tuple[str, FastAPI]) -> None:
    url, _ = server
    data_ref = parse_image_url("data:image/png;base64," + base64.b64encode(PNG).decode())
    http_ref = parse_image_url(f"{url}/red.png")
    async with fetcher() as f:
        first, second = await f.fetch_all([data_ref, http_ref])
    assert first is data_ref
    assert second.sha256 == hashlib.sha256(f"{url}/red.png".encode()).hexdigest()  # traces do not change
    assert second.source_url == f"{url}/red.png" and second.is_data_url
    assert second.url == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert base64.b64decode(second.base64_data or "") == PNG and second.media_type == "image/png"


async def test_refusal_names_the_image(server: tuple[str, FastAPI]) -> None:
    url, _ = server
    refs = [parse_image_url(f"{url}/red.png"), parse_image_url(f"{url}/page.html")]
    async with fetcher() as f:
        with pytest.raises(ImageRefused) as info:
            await f.fetch_all(refs)
    assert info.value.message.startswith(f"image 2 ({url}/page.html): ")


# ---- through the proxy, URLs passed on (image_urls="pass"): the judges' own fetch ------------------
# With the default image_urls="fetch" the proxy fetches every image URL itself before anything goes
# upstream (tests/server/test_image_urls.py); the judge's fetch_images matters when URLs pass through.


@contextlib.asynccontextmanager
async def stack(tmp_path: Path, fetch_images: bool, **overrides: Any) -> AsyncIterator[tuple[str, Any, FakeUpstream]]:
    judge_app = create_judge_app({"unfaithful": []})
    vllm = FakeUpstream()
    async with running_judge_server(judge_app) as judge_url:
        judge = JudgeConfig(
            name="claude",
            backend="anthropic",
            model="judge-model",
            base_url=judge_url,
            api_key="sk-test",  # type: ignore[arg-type]
            timeout_s=ANSWERED_S,
            max_retries=0,
            fetch_images=fetch_images,
        )
        settings = Settings(
            upstream_url="http://vllm.test", trace_path=str(tmp_path / "t.jsonl"), judges=[judge], **overrides
        )
        app = create_app(settings, upstream_transport=vllm.transport())
        async with running_app(app) as url:
            yield url, judge_app.state.judge, vllm


def image_body(url: str) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is it?"}]
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


async def test_proxy_sends_fetched_bytes_to_a_judge_that_wants_them(
    server: tuple[str, FastAPI], tmp_path: Path
) -> None:
    image_url = f"{server[0]}/red.png"
    async with stack(tmp_path, True, image_fetch=LOOPBACK, image_urls="pass") as (url, judge, vllm):
        async with httpx.AsyncClient(timeout=ANSWERED_S) as http:
            response = await http.post(f"{url}/v1/chat/completions", json=image_body(image_url))
    assert response.status_code == 200, response.text
    assert judge.last_request["images"] == [{"source": "base64", "media_type": "image/png"}]
    sent = json.loads([r for r in vllm.requests if r.url.path == "/v1/chat/completions"][0].content)
    assert sent["messages"][0]["content"][0]["image_url"]["url"] == image_url  # vLLM still gets the URL
    trace = json.loads((tmp_path / "t.jsonl").read_text())
    assert trace["images"] == [hashlib.sha256(image_url.encode()).hexdigest()]


async def test_proxy_refuses_before_anything_goes_upstream(server: tuple[str, FastAPI], tmp_path: Path) -> None:
    image_url = f"{server[0]}/red.png"
    async with stack(tmp_path, True, image_urls="pass") as (url, judge, vllm):  # default policy: loopback refused
        async with httpx.AsyncClient(timeout=ANSWERED_S) as http:
            response = await http.post(f"{url}/v1/chat/completions", json=image_body(image_url))
            off = await http.post(
                f"{url}/v1/chat/completions", json=image_body(image_url), headers={"x-faithproxy-mode": "off"}
            )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "image_refused"
    assert error["param"] == "messages" and error["message"].startswith("image 1 (")
    assert [r for r in vllm.requests if r.url.path == "/v1/chat/completions"] == [vllm.requests[-1]]  # off only
    assert judge.requests == 0 and server[1].state.hits == []
    assert off.status_code == 200  # off mode checks nothing, so it fetches nothing


async def test_judge_without_fetch_images_gets_the_url(server: tuple[str, FastAPI], tmp_path: Path) -> None:
    async with stack(tmp_path, False, image_urls="pass") as (url, judge, _):
        async with httpx.AsyncClient(timeout=ANSWERED_S) as http:
            response = await http.post(f"{url}/v1/chat/completions", json=image_body(f"{server[0]}/red.png"))
    assert response.status_code == 200
    assert judge.last_request["images"] == [{"source": "url", "media_type": None}]
    assert server[1].state.hits == []
