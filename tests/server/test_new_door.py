"""New doors, declared in this file alone, get everything a door gets from the server: API keys,
admission, limits, the policy headers, the media-URL policy, its own error format, metrics under its
path, off mode, the verified modes, reports and the OpenAPI schema. Nothing under server/ names them: the
door table (server/protocol/doors.py) is the one declaration every room reads.

The first speaks chat's body but Anthropic's error format, so each refusal shows that the format comes
from the declaration, not from the path. The second is a new API family with a wire format of its own
(`/v2/ask`: a question in, JSON lines out): its request model (its parser and its OpenAPI), its
translation to chat, its renderer and its answer's model are all written here, and the server serves it
as it serves its own.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from pydantic import BaseModel, Field

from faithproxy.clients.vllm import CHAT_PATH
from faithproxy.server.app import create_app
from faithproxy.server.doors.bodies import body_parser
from faithproxy.server.doors.chat import ChatRenderer, chat_events, parse_chat_body
from faithproxy.server.doors.schema import DoorRequest
from faithproxy.server.doors.table import DOORS
from faithproxy.server.protocol.doors import Api, Door
from faithproxy.server.protocol.render import Answer, Ending, Renderer
from faithproxy.server.settings import Settings
from faithproxy.testing import SENTENCES, FakeUpstream, running_app
from faithproxy.testing.metrics import metric

if TYPE_CHECKING:
    from faithproxy.faithcore.correction import EmitText
    from faithproxy.faithcore.errors import FaithproxyError

PATH = "/v2/checked-chat"
NEW_DOOR = Door(
    path=PATH,
    api=Api.ANTHROPIC,
    parse=parse_chat_body,
    renderer=ChatRenderer,
    off_path=CHAT_PATH,
    shadow_reader=chat_events,  # its off mode passes vLLM's chat completions through
    name="checked_chat",
)


# ---- a new API family: a question in, JSON lines out ---------------------------------------------

ASK_PATH = "/v2/ask"


class AskRequest(DoorRequest):
    """A question; fields not listed pass through to the translation. Its parser, its OpenAPI."""

    question: str = Field(min_length=1)


parse_ask = body_parser(AskRequest)


class AskAnswer(BaseModel):
    """The whole answer to a question that did not ask for a stream."""

    question: str
    answer: str
    finish_reason: str | None
    usage: dict[str, Any]
    faithfulness: dict[str, Any]


def ask_to_chat(body: dict[str, Any], mode: str) -> dict[str, Any]:
    """The question as the one user message of a chat body, the token limit admission settled kept."""
    chat = {"model": body["model"], "messages": [{"role": "user", "content": body["question"]}]}
    return {**chat, "stream": bool(body.get("stream")), **{k: body[k] for k in ("max_tokens",) if k in body}}


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


class AskRenderer(Renderer):
    """One JSON object a line (`type`: text, verdicts, end, error) and nothing after the last."""

    done = b""
    media_type = "application/x-ndjson"

    def text(self, item: EmitText, step: dict[str, Any] | None) -> list[bytes]:
        return [line({"type": "text", "field": item.field, "text": item.text, **({"step": step} if step else {})})]

    def verdicts(self, verdicts: list[dict[str, Any]]) -> list[bytes]:
        return [line({"type": "verdicts", "verdicts": verdicts})]

    def end(self, finish_reason: str | None, ending: Ending) -> list[bytes]:
        return [line({"type": "end", "finish_reason": finish_reason, "faithfulness": ending.summary})]

    def error(self, exc: FaithproxyError) -> bytes:
        return line({"type": "error", "message": exc.message})

    def body(self, answer: Answer, ending: Ending) -> AskAnswer:
        return AskAnswer(
            question=self.reply.request["question"],  # the client's body, not the chat body it became
            answer=answer.text.get("content", ""),
            finish_reason=answer.finish_reason,
            usage=ending.usage,
            faithfulness=ending.summary,
        )


ASK = Door(
    path=ASK_PATH,
    api=Api.OPENAI,
    parse=parse_ask,
    renderer=AskRenderer,
    off_path=CHAT_PATH,
    translate=ask_to_chat,
    request_model=AskRequest,
    name="ask",
)
KEY = "sk-new-door-client-key-0a1b2c3d"
PNG = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="
)


def chat(*images: str, **extra: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is in the image?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return {"model": "fake-vlm", "messages": [{"role": "user", "content": parts}], **extra}


def anthropic_refusal(answer: httpx.Response, status: int, kind: str) -> str:
    """The message of a refusal in Anthropic's format (asserting the format and the status)."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert "param" not in body["error"]  # not OpenAI's shape
    return str(body["error"]["message"])


@pytest.fixture
async def proxy() -> Any:
    upstream = FakeUpstream()
    settings = Settings(
        upstream_url="http://vllm.test",
        api_keys=[KEY],
        default_detector="none",
        max_images_per_request=1,
        max_tokens_cap=50,
    )
    app = create_app(settings, upstream_transport=upstream.transport(), doors=DOORS.with_doors(NEW_DOOR, ASK))
    async with running_app(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30, headers={"authorization": f"Bearer {KEY}"}) as http:
            yield http, upstream


async def test_refusals_at_the_new_door_come_in_its_format(proxy: Any) -> None:
    http, upstream = proxy
    async with httpx.AsyncClient(base_url=str(http.base_url), timeout=30) as anonymous:
        assert "API key" in anthropic_refusal(await anonymous.post(PATH, json=chat()), 401, "authentication_error")
        # the door speaks Anthropic's API, so its SDK's x-api-key is read as the key
        keyed = await anonymous.post(PATH, json=chat(), headers={"x-api-key": KEY, "x-faithproxy-mode": "off"})
        assert keyed.status_code == 200, keyed.text
    refusals = [
        ({"content": b"{not json"}, "invalid_request_error"),  # admission: the body
        ({"json": chat(PNG, PNG)}, "invalid_request_error"),  # limits: images per request
        ({"json": chat(max_tokens=500)}, "invalid_request_error"),  # limits: the max_tokens cap
        ({"json": chat("file:///etc/passwd")}, "invalid_request_error"),  # the media-URL policy
        ({"json": chat(), "headers": {"x-faithproxy-max-retries": "many"}}, "invalid_request_error"),  # policy
    ]
    seen_before = len(upstream.requests)
    for mode in ("off", "correct"):
        for request, kind in refusals:
            headers = {"x-faithproxy-mode": mode, **request.pop("headers", {})}
            answer = await http.post(PATH, headers=headers, **request)
            anthropic_refusal(answer, 400, kind)
            request["headers"] = {k: v for k, v in headers.items() if k != "x-faithproxy-mode"}
    assert len(upstream.requests) == seen_before  # nothing refused reached vLLM
    metrics = (await http.get("/metrics")).text
    # 5 refusals in each of 2 modes, plus the 401 of the middleware in front
    assert metric(metrics, "faithproxy_requests_total", endpoint=PATH, mode="rejected", status="4xx") == 11


async def test_the_new_door_serves_off_and_verified_modes_and_is_counted_and_reported(proxy: Any) -> None:
    http, upstream = proxy
    before = (await http.get("/metrics")).text
    # series exist at zero before the door's first request: the label set is the table's paths
    assert f'endpoint="{PATH}"' in before
    off = await http.post(PATH, json=chat(PNG), headers={"x-faithproxy-mode": "off"})
    assert off.status_code == 200 and off.headers["x-faithproxy-mode"] == "off", off.text
    forwarded = upstream.requests[-1]
    # the client's body, as admission settled it (the server's max_tokens cap added)
    assert forwarded.url.path == CHAT_PATH and json.loads(forwarded.content) == chat(PNG, max_tokens=50)

    verified = await http.post(PATH, json=chat(PNG), headers={"x-faithproxy-mode": "correct"})
    assert verified.status_code == 200, verified.text
    assert verified.json()["faithfulness"]["mode"] == "correct"
    request_id = verified.headers["x-faithproxy-request-id"]
    report = await http.get(f"/v1/faithfulness/{request_id}")
    assert report.status_code == 200 and report.json()["id"] == request_id, report.text

    after = (await http.get("/metrics")).text
    for mode in ("off", "correct"):
        assert metric(after, "faithproxy_requests_total", endpoint=PATH, mode=mode, status="2xx") == 1
    schema = (await http.get("/openapi.json")).json()
    assert schema["paths"][PATH]["post"]["operationId"].startswith("checked_chat")


async def test_a_door_with_a_wire_format_of_its_own_is_served_from_its_declaration(proxy: Any) -> None:
    http, upstream = proxy
    question = {"model": "fake-vlm", "question": "What colour is the circle?"}
    whole = await http.post(ASK_PATH, json=question, headers={"x-faithproxy-mode": "correct"})
    assert whole.status_code == 200 and whole.headers["content-type"] == "application/json", whole.text
    answer = whole.json()
    assert answer["question"] == question["question"] and answer["answer"] == "".join(SENTENCES)
    assert answer["finish_reason"] == "stop" and answer["faithfulness"]["mode"] == "correct"
    # vLLM was asked in chat, through the door's translation (the server's max_tokens cap carried over)
    forwarded = upstream.requests[-1]
    sent = json.loads(forwarded.content)
    assert forwarded.url.path == CHAT_PATH and sent["messages"] == [{"role": "user", "content": question["question"]}]
    assert sent["max_tokens"] == 50
    report = await http.get(f"/v1/faithfulness/{whole.headers['x-faithproxy-request-id']}")
    assert report.status_code == 200, report.text

    streamed = await http.post(ASK_PATH, json={**question, "stream": True}, headers={"x-faithproxy-mode": "detect"})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(text) for text in streamed.text.splitlines()]
    assert "".join(obj["text"] for obj in lines if obj["type"] == "text") == answer["answer"]
    assert lines[-1]["type"] == "end" and lines[-1]["faithfulness"]["mode"] == "detect"
    assert not streamed.text.rstrip().endswith("[DONE]")

    refused = await http.post(ASK_PATH, json={"model": "fake-vlm"}, headers={"x-faithproxy-mode": "correct"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "question"  # OpenAI's format

    metrics = (await http.get("/metrics")).text
    for mode in ("correct", "detect"):
        assert metric(metrics, "faithproxy_requests_total", endpoint=ASK_PATH, mode=mode, status="2xx") == 1
    schema = (await http.get("/openapi.json")).json()
    body = schema["paths"][ASK_PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/AskRequest")
    assert "question" in schema["components"]["schemas"]["AskRequest"]["required"]


def test_a_table_refuses_two_doors_at_one_path() -> None:
    with pytest.raises(ValueError, match="two doors"):
        type(DOORS)([NEW_DOOR, NEW_DOOR])
    assert DOORS.with_doors(NEW_DOOR).get(PATH) is NEW_DOOR and DOORS.get(PATH) is None
