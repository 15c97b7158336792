"""Client media URLs through the proxy (server/admission/image_urls.py): in every mode, no http(s) URL a client
chose reaches vLLM unchecked.

No packet leaves the machine: image host names resolve through an injected resolver (to a private
address, or to one on the public internet), and the fetch of a "public" image goes to an
httpx.MockTransport that plays the image host. vLLM is a MockTransport too, recording every request;
the judge is the local judge server on 127.0.0.1.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.clients.image_fetch import FetchPolicy, ImageFetcher
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, running_app

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PNG_DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
PUBLIC_ADDRESS = "93.184.216.34"  # a public address: only ever "reached" through the mock transport
NAMES = {
    "images.example.test": [PUBLIC_ADDRESS],
    "metadata.internal.test": ["169.254.169.254"],  # the cloud metadata service
    "intranet.test": ["10.0.0.5"],
    "mixed.test": [PUBLIC_ADDRESS, "192.168.1.1"],  # one private address is enough to refuse
}
MODES = ["off", "detect", "correct"]


async def resolve(host: str, port: int) -> list[str]:
    if host not in NAMES:
        raise OSError(f"no such host {host}")
    return NAMES[host]


class ImageHost:
    """Plays the image host at PUBLIC_ADDRESS; records what it was asked."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.host != PUBLIC_ADDRESS:  # the fetcher connects to the address it checked
            raise AssertionError(f"a fetch went to {request.url.host}, not a checked address")
        if request.url.path == "/red.png":
            return httpx.Response(200, content=PNG, headers={"content-type": "image/png"})
        if request.url.path == "/to-metadata":
            return httpx.Response(302, headers={"location": "http://metadata.internal.test/latest/"})
        return httpx.Response(404)


class Stack:
    def __init__(self, url: str, vllm: FakeUpstream, judge: Any, host: ImageHost) -> None:
        self.url, self.vllm, self.judge, self.host = url, vllm, judge, host

    async def ask(self, body: dict[str, Any], mode: str, *, stream: bool = False) -> httpx.Response:
        headers = {"x-faithproxy-mode": mode}
        async with httpx.AsyncClient(timeout=10) as http:
            return await http.post(f"{self.url}/v1/chat/completions", json={**body, "stream": stream}, headers=headers)

    def chat_requests(self) -> list[dict[str, Any]]:
        """Every chat request vLLM received (the answer, regenerations, self-checks)."""
        return [json.loads(r.content) for r in self.vllm.requests if r.url.path == "/v1/chat/completions"]


@contextlib.asynccontextmanager
async def stack(tmp_path: Path, **overrides: Any) -> AsyncIterator[Stack]:
    judge_app = create_judge_app({"unfaithful": []})
    vllm, host = FakeUpstream(), ImageHost()
    fetcher = ImageFetcher(
        overrides.pop("policy", FetchPolicy()), resolver=resolve, transport=httpx.MockTransport(host)
    )
    async with running_judge_server(judge_app) as judge_url:
        judge = JudgeConfig(name="claude", backend="anthropic", model="judge-model", base_url=judge_url,
                            api_key="sk-test", timeout_s=5, max_retries=0)  # type: ignore[arg-type]  # fmt: skip
        settings = Settings(
            upstream_url="http://vllm.test", trace_path=str(tmp_path / "t.jsonl"), judges=[judge], **overrides
        )
        app = create_app(settings, upstream_transport=vllm.transport(), image_fetcher=fetcher)
        async with running_app(app) as url:
            yield Stack(url, vllm, judge_app.state.judge, host)


def body_with(*parts: dict[str, Any]) -> dict[str, Any]:
    content = [*parts, {"type": "text", "text": "What is in the image?"}]
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}],
    }


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def assert_refused(response: httpx.Response, code: str, part: str, *words: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == code
    assert error["param"] == "messages" and error["message"].startswith(part + " (")  # the part, by name
    for word in words:
        assert word in error["message"]
    return error


@pytest.mark.parametrize(
    ("mode", "host"),
    [(mode, "metadata.internal.test") for mode in MODES]
    + [("off", host) for host in ("intranet.test", "mixed.test", "127.0.0.1", "[::1]")],
)
async def test_a_private_address_image_url_is_refused_before_any_upstream_contact(
    tmp_path: Path, mode: str, host: str
) -> None:
    async with stack(tmp_path) as proxy:
        response = await proxy.ask(body_with(image(PNG_DATA_URL), image(f"http://{host}/latest/meta-data")), mode)
    assert_refused(response, "image_refused", "messages[1].content[1].image_url", f"http://{host}/", "address")
    assert proxy.chat_requests() == []  # vLLM was never asked
    assert proxy.judge.requests == 0 and proxy.host.requests == []  # nor the judge; nothing was fetched


@pytest.mark.parametrize("mode", MODES)
async def test_a_redirect_to_a_private_address_is_refused(tmp_path: Path, mode: str) -> None:
    async with stack(tmp_path) as proxy:
        response = await proxy.ask(body_with(image("http://images.example.test/to-metadata")), mode)
    assert_refused(response, "image_refused", "messages[1].content[0].image_url", "metadata.internal.test")
    assert [r.url.path for r in proxy.host.requests] == ["/to-metadata"]  # the redirect was not followed
    assert proxy.chat_requests() == []


@pytest.mark.parametrize(("mode", "stream"), [("off", False), ("off", True), ("detect", True), ("correct", False)])
async def test_a_public_image_url_arrives_at_vllm_and_the_judge_as_bytes(
    tmp_path: Path, mode: str, stream: bool
) -> None:
    url = "http://images.example.test/red.png"
    async with stack(tmp_path) as proxy:
        response = await proxy.ask(body_with({"type": "image_url", "image_url": {"url": url, "detail": "low"}}), mode,
                                   stream=stream)  # fmt: skip
    assert response.status_code == 200, response.text
    fetched = proxy.host.requests
    assert len(fetched) == 1 and fetched[0].headers["host"] == "images.example.test"  # the name, pinned address
    sent = proxy.chat_requests()
    assert sent, "vLLM was asked nothing"
    for request in sent:  # the answer and any regeneration or self-check alike
        part = request["messages"][1]["content"][0]
        assert part == {"type": "image_url", "image_url": {"url": PNG_DATA_URL, "detail": "low"}}
        assert "images.example.test" not in json.dumps(request)
    if mode != "off":
        assert proxy.judge.last_request["images"] == [{"source": "base64", "media_type": "image/png"}]


async def test_the_string_form_of_an_image_url_is_fetched_too(tmp_path: Path) -> None:
    async with stack(tmp_path) as proxy:
        response = await proxy.ask(body_with({"type": "image_url", "image_url": "http://images.example.test/red.png"}),
                                   "off")  # fmt: skip
    assert response.status_code == 200, response.text
    assert proxy.chat_requests()[0]["messages"][1]["content"][0]["image_url"] == PNG_DATA_URL


@pytest.mark.parametrize("mode", ["off", "correct"])
async def test_refuse_answers_400_for_any_image_url_and_fetches_nothing(tmp_path: Path, mode: str) -> None:
    async with stack(tmp_path, image_urls="refuse") as proxy:
        refused = await proxy.ask(body_with(image("https://images.example.test/red.png")), mode)
        inline = await proxy.ask(body_with(image(PNG_DATA_URL)), mode)
    assert_refused(refused, "image_url_not_allowed", "messages[1].content[0].image_url", "data URL")
    assert proxy.host.requests == []
    assert inline.status_code == 200  # data URLs are what such a server wants
    assert len(proxy.chat_requests()) >= 1


@pytest.mark.parametrize("mode", ["off", "correct"])
async def test_pass_sends_the_url_to_vllm_as_the_client_wrote_it(tmp_path: Path, mode: str) -> None:
    url = "https://images.example.test/red.png"
    async with stack(tmp_path, image_urls="pass") as proxy:
        response = await proxy.ask(body_with(image(url)), mode)
    assert response.status_code == 200, response.text
    assert proxy.chat_requests()[0]["messages"][1]["content"][0]["image_url"]["url"] == url
    assert proxy.host.requests == []  # the judge was not configured to fetch: it gets the URL


VIDEO = {"type": "video_url", "video_url": {"url": "http://intranet.test/clip.mp4"}}


# The scheme is checked before the setting, so `pass`, the most permissive, stands for all three.
@pytest.mark.parametrize(
    ("handling", "part", "words"),
    [
        ("pass", image("file:///etc/passwd"), ["data: or http(s)"]),
        ("pass", image("ftp://images.example.test/red.png"), ["data: or http(s)"]),
        ("fetch", VIDEO, ["video", "data URL"]),
        ("pass", VIDEO, []),
        ("refuse", {"type": "audio_url", "audio_url": {"url": "https://images.example.test/a.wav"}}, ["audio"]),
    ],
)
async def test_other_schemes_and_fetched_video_or_audio_are_refused_in_off_mode(
    tmp_path: Path, handling: str, part: dict[str, Any], words: list[str]
) -> None:
    async with stack(tmp_path, image_urls=handling) as proxy:
        response = await proxy.ask(body_with(part), "off")
    kind = part["type"]
    if handling == "pass" and kind != "image_url":  # pass leaves http(s) media to vLLM's own domain list
        assert response.status_code == 200
        return
    assert_refused(response, "image_refused", f"messages[1].content[0].{kind}", *words)
    assert proxy.chat_requests() == [] and proxy.host.requests == []


async def test_a_failed_fetch_cancels_the_others_and_names_its_part(tmp_path: Path) -> None:
    parts = [image("http://images.example.test/red.png"), image("http://images.example.test/missing.png")]
    async with stack(tmp_path) as proxy:
        response = await proxy.ask(body_with(*parts), "off")
    assert_refused(response, "image_fetch_failed", "messages[1].content[1].image_url", "HTTP 404")
    assert proxy.chat_requests() == []


# The other doors' image shapes (server/admission/media_parts.py): settled by admission like chat's, in every mode.
DOOR_IMAGES = {
    "/v1/responses": (
        lambda url: {"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is in the image?"}, {"type": "input_image", "image_url": url}]}]},
        "input[0].content[1].image_url",
    ),
    "/v1/messages": (
        lambda url: {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in the image?"},
            {"type": "image", "source": {"type": "url", "url": url}}]}]},
        "messages[0].content[1].source",
    ),
}  # fmt: skip


def refusal_message(response: httpx.Response) -> str:
    """The error message in the door's format: Anthropic's on /v1/messages, OpenAI's elsewhere."""
    body = response.json()
    return body["error"]["message"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("door", DOOR_IMAGES)
async def test_every_door_refuses_a_private_image_url_before_any_upstream_contact(
    tmp_path: Path, door: str, mode: str
) -> None:
    make, part = DOOR_IMAGES[door]
    async with stack(tmp_path) as proxy, httpx.AsyncClient(timeout=10) as http:
        response = await http.post(
            proxy.url + door, json=make("http://metadata.internal.test/latest"), headers={"x-faithproxy-mode": mode}
        )
    assert response.status_code == 400, response.text
    assert refusal_message(response).startswith(part + " (http://metadata.internal.test/")
    if door == "/v1/messages":
        assert response.json()["type"] == "error"  # Anthropic's error shape
    assert [r for r in proxy.vllm.requests if r.method == "POST"] == [] and proxy.host.requests == []


@pytest.mark.parametrize("door", DOOR_IMAGES)
async def test_every_door_forwards_a_fetched_public_image_inline_in_off_mode(tmp_path: Path, door: str) -> None:
    make, _ = DOOR_IMAGES[door]
    async with stack(tmp_path) as proxy, httpx.AsyncClient(timeout=10) as http:
        await http.post(proxy.url + door, json=make("http://images.example.test/red.png"),
                        headers={"x-faithproxy-mode": "off"})  # fmt: skip
    assert len(proxy.host.requests) == 1
    (sent,) = [json.loads(r.content) for r in proxy.vllm.requests if r.url.path == door]  # vLLM's own endpoint
    image_part = sent["input" if door == "/v1/responses" else "messages"][0]["content"][1]
    if door == "/v1/responses":
        assert image_part == {"type": "input_image", "image_url": PNG_DATA_URL}
    else:
        assert image_part["source"] == {"type": "base64", "media_type": "image/png", "data": PNG_DATA_URL.split(",")[1]}
    assert "images.example.test" not in json.dumps(sent)
