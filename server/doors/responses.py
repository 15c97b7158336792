"""POST /v1/responses: OpenAI's Responses API.

The Responses API offers no way to continue a partial message, so in `detect` and `correct` the request
is read as a chat request (`translate`: `instructions` become the system message, `input` items the
messages, `input_image` parts image_url parts, `max_output_tokens` the max_tokens) and driven through
vLLM's chat completions as the chat door drives it; only the rendering differs: the machine's emits
become Responses events (`ResponsesRenderer`, with `ResponsesEvents`): reasoning text as a `reasoning`
item (`response.reasoning_text.delta`), answer text as a `message` item (`response.output_text.delta`),
one delta per verified step in `correct`. A step's annotation rides as `faithfulness` on its delta
event and the summary on the final response; the openai SDK keeps unknown fields, so its typed events
still parse. `off` passes vLLM's own /v1/responses through (server/doors/off.py), and the shadow check
reads what it passed (`responses_events`).

What a stateless verified chain cannot do (`previous_response_id`, `conversation`, `store`,
`background`, tools, non-message input items) is a 400 in `detect` and `correct` naming it, and that
`off` passes it through.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.types import Channel
from faithproxy.server.doors.bodies import json_object, model_and_stream
from faithproxy.server.doors.captured import json_body, sse_objects, text_events
from faithproxy.server.doors.schema import OpenModel, openai_responses
from faithproxy.server.protocol.doors import Api, Door
from faithproxy.server.protocol.errors import error_frame
from faithproxy.server.protocol.render import Answer, Ending, Renderer, Reply

if TYPE_CHECKING:
    from faithproxy.faithcore.correction import EmitText
    from faithproxy.faithcore.errors import FaithproxyError
    from faithproxy.server.protocol.wires import RoundEvents

RESPONSES_PATH = "/v1/responses"


def parse_responses_body(raw: bytes) -> dict[str, Any]:
    """A /v1/responses (OpenAI Responses API) body, else a PolicyError (400). Unknown fields pass through."""
    body = json_object(raw)
    given = body.get("input")
    if not (isinstance(given, str) and given) and not (
        isinstance(given, list) and given and all(isinstance(item, dict | str) for item in given)
    ):
        raise PolicyError("'input' must be a non-empty string or a non-empty list of input items", param="input")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise PolicyError("'instructions' must be a string", param="instructions")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise PolicyError("'max_output_tokens' must be a positive integer", param="max_output_tokens")
    return model_and_stream(body)


# ---- the translation to chat ------------------------------------------------------------------------

_UNSUPPORTED = ("previous_response_id", "conversation", "store", "background", "tools", "prompt")
_PASSED_ON = ("temperature", "top_p", "seed", "user", "metadata", "top_k", "repetition_penalty")


def _unsupported(body: dict[str, Any]) -> str | None:
    for name in _UNSUPPORTED:
        if body.get(name) not in (None, False, []):
            return name
    return None


def _part(part: Any, where: str) -> dict[str, Any]:
    """One content part as a chat content part."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image: dict[str, Any] = {"url": part["image_url"]}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise PolicyError(
        f"{where}: only input_text and input_image (image_url) parts are supported outside X-Faithproxy-Mode: off",
        param="input",
    )


def _reasoning(item: dict[str, Any], index: int) -> str:
    """The text of a reasoning item a client sent back (an earlier response's output)."""
    if item.get("encrypted_content"):
        raise PolicyError(f"input[{index}]: encrypted reasoning content is not supported", param="input")
    for key in ("content", "summary"):  # vLLM's own mapping: the content, else the summary
        parts = item.get(key)
        if isinstance(parts, list) and parts and isinstance(parts[0], dict) and isinstance(parts[0].get("text"), str):
            return str(parts[0]["text"])
    return ""


def _messages(given: list[Any]) -> list[dict[str, Any]]:
    """Input items as chat messages. A reasoning item becomes the `reasoning` of an assistant message, and the
    assistant message item after it joins that message (as vLLM's own /v1/responses builds them); whether
    past reasoning is rendered is the chat template's choice."""
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(given):
        last = messages[-1] if messages else None
        if isinstance(item, dict) and item.get("type") == "reasoning":
            messages.append({"role": "assistant", "reasoning": _reasoning(item, index)})
            continue
        message = _message(item, index)
        if last is not None and "reasoning" in last and "content" not in last and message["role"] == "assistant":
            last["content"] = message["content"]
            continue
        messages.append(message)
    for message in messages:
        message.setdefault("content", "")  # a reasoning item with no message after it
    return messages


def _message(item: Any, index: int) -> dict[str, Any]:
    if isinstance(item, str):
        return {"role": "user", "content": item}
    if item.get("type", "message") != "message" or item.get("role") not in ("user", "assistant", "system", "developer"):
        raise PolicyError(
            f"input[{index}]: only message items are supported outside X-Faithproxy-Mode: off", param="input"
        )
    role = "system" if item["role"] == "developer" else item["role"]
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise PolicyError(f"input[{index}].content must be a string or a list of parts", param="input")
    return {"role": role, "content": [_part(p, f"input[{index}].content[{i}]") for i, p in enumerate(content)]}


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses request as the chat request vLLM is driven with (a PolicyError for what has none)."""
    given = body["input"]
    messages = [{"role": "user", "content": given}] if isinstance(given, str) else []
    if isinstance(given, list):
        messages = _messages(given)
    if body.get("instructions"):
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "stream": bool(body.get("stream"))}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in _PASSED_ON:
        if body.get(name) is not None:
            chat[name] = body[name]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        chat["reasoning_effort"] = reasoning["effort"]
    return chat


def translate(body: dict[str, Any], mode: str) -> dict[str, Any]:
    """A PolicyError (400) for what a stateless verified chain can't do, else the chat body."""
    unsupported = _unsupported(body)
    if unsupported is not None:
        raise PolicyError(
            f"'{unsupported}' is not supported by the Responses API in {mode} mode: a verified chain is "
            "stateless and text-only (X-Faithproxy-Mode: off passes it through to vLLM)",
            param=unsupported,
        )
    return chat_body(body)


# ---- the shadow check: a Responses response off mode passed through -------------------------------


def responses_events(data: bytes, stream: bool) -> RoundEvents | None:
    """The round a captured Responses response holds: its reasoning and output text, in order."""
    texts: list[tuple[str, str]] = []
    if stream:
        objs = sse_objects(data)
        if objs is None:
            return None
        final = None
        for obj in objs:
            kind = obj.get("type")
            if kind == "response.reasoning_text.delta" and isinstance(obj.get("delta"), str):
                texts.append(("reasoning", obj["delta"]))
            elif kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):
                texts.append(("content", obj["delta"]))
            elif kind in ("response.completed", "response.incomplete"):
                final = obj.get("response")
            elif kind in ("response.failed", "error"):
                return None  # the response broke off: what came before it is no whole chain
        response = final if isinstance(final, dict) else {}
    else:
        response = json_body(data) or {}
        for item in response.get("output") or ():
            field = {"reasoning": "reasoning", "message": "content"}.get(item.get("type"))
            if field is None:
                continue
            for part in item.get("content") or ():
                if part.get("type") in ("reasoning_text", "output_text") and isinstance(part.get("text"), str):
                    texts.append((field, part["text"]))
    if not texts:
        return None
    incomplete = response.get("status") == "incomplete"
    return text_events(texts, "length" if incomplete else "stop", response.get("id"))


# ---- OpenAPI ---------------------------------------------------------------------------------------


class ResponsesRequest(OpenModel):
    """An OpenAI Responses API request; fields not listed are forwarded to vLLM untouched in off mode."""

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(
        description="A string or message items (input_text, input_image parts) unless X-Faithproxy-Mode is off."
    )
    instructions: str | None = None
    stream: bool | None = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None


# ---- the renderer ----------------------------------------------------------------------------------


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


class ResponsesEvents:
    """The Responses objects and events of one response: output items in order (a `reasoning` item for
    reasoning text, a `message` item for answer text), each opened, filled by deltas and closed."""

    def __init__(self, response_id: str, model: str, request: dict[str, Any]) -> None:
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.request = request
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items, closed ones final
        self._open: dict[str, Any] | None = None  # the item being written
        self._started = False

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def response(self, status: str, **extra: Any) -> dict[str, Any]:
        body = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "output": list(self.output),
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {},
            "parallel_tool_calls": False,
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "tool_choice": "none",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            **extra,
        }

    def start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [
            self.event("response.created", response=self.response("in_progress")),
            self.event("response.in_progress", response=self.response("in_progress")),
        ]

    def text(self, channel: Channel, text: str, faithfulness: dict[str, Any] | None) -> list[bytes]:
        kind = "reasoning" if channel is Channel.REASONING else "message"
        frames = self.start()
        if self._open is not None and self._open["type"] != kind:
            frames += self.close()
        if self._open is None:
            frames += self._open_item(kind)
        item = self._open
        assert item is not None
        item["_text"] += text
        extra = {"faithfulness": faithfulness} if faithfulness else {}
        where = {"item_id": item["id"], "output_index": len(self.output), "content_index": 0}
        if kind == "reasoning":
            return [*frames, self.event("response.reasoning_text.delta", **where, delta=text, **extra)]
        return [*frames, self.event("response.output_text.delta", **where, delta=text, logprobs=[], **extra)]

    def _open_item(self, kind: str) -> list[bytes]:
        index = len(self.output)
        if kind == "reasoning":
            self._open = {"type": "reasoning", "id": f"rs_{self.id}_{index}", "_text": ""}
            item = {"type": "reasoning", "id": self._open["id"], "summary": [], "content": [], "status": "in_progress"}
            return [self.event("response.output_item.added", output_index=index, item=item)]
        self._open = {"type": "message", "id": f"msg_{self.id}_{index}", "_text": ""}
        item = {"type": "message", "id": self._open["id"], "role": "assistant", "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": self._open["id"], "output_index": index, "content_index": 0}
        return [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event("response.content_part.added", **where, part=part),
        ]

    def close(self) -> list[bytes]:
        """Ends the item being written: its done events, and the item joins `output`."""
        item, self._open = self._open, None
        if item is None:
            return []
        index, text = len(self.output), item["_text"]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        final = self.item(item["type"], item["id"], text)
        self.output.append(final)
        if item["type"] == "reasoning":
            return [
                self.event("response.reasoning_text.done", **where, text=text),
                self.event("response.output_item.done", output_index=index, item=final),
            ]
        part = final["content"][0]
        return [
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=index, item=final),
        ]

    @staticmethod
    def item(kind: str, item_id: str, text: str) -> dict[str, Any]:
        if kind == "reasoning":
            content = [{"type": "reasoning_text", "text": text}]
            return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": "completed"}
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {"type": "message", "id": item_id, "role": "assistant", "status": "completed", "content": [part]}

    def final(self, finish_reason: str | None, usage: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
        """The finished response object: `incomplete` when the token budget ended it."""
        if finish_reason == "length":
            extra = {"incomplete_details": {"reason": "max_output_tokens"}}
            return self.response("incomplete", usage=_usage(usage), faithfulness=summary, **extra)
        return self.response("completed", usage=_usage(usage), faithfulness=summary)


class ResponsesRenderer(Renderer):
    """Responses events out (a stream ends on its terminal event, with no [DONE], as vLLM's own), and
    the response object as a whole body."""

    done = b""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply)
        self.id = f"resp_{reply.request_id}"
        self.events = ResponsesEvents(self.id, reply.model, reply.request)

    def text(self, item: EmitText, step: dict[str, Any] | None) -> list[bytes]:
        return self.events.text(item.channel, item.text, None if step is None else {"step": step})

    def verdicts(self, verdicts: list[dict[str, Any]]) -> list[bytes]:
        verdict_event = self.events.event("response.faithfulness.verdicts", faithfulness={"verdicts": verdicts})
        return [*self.events.start(), verdict_event]

    def end(self, finish_reason: str | None, ending: Ending) -> list[bytes]:
        events = self.events
        frames = [*events.start(), *events.close()]
        final = events.final(finish_reason, ending.usage, ending.summary)
        final.update(ending.judge_usage)  # the judge's bill beside `usage` (server/chain/judge_bill.py)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*frames, events.event(kind, response=final)]

    def error(self, exc: FaithproxyError) -> bytes:
        return error_frame(exc)

    def body(self, answer: Answer, ending: Ending) -> dict[str, Any]:
        events = ResponsesEvents(self.id, self.reply.model, self.reply.request)
        events.created = int(self.reply.started_wall)
        reasoning = answer.text.get("reasoning") or answer.text.get("reasoning_content")
        if reasoning:
            events.output.append(events.item("reasoning", f"rs_{events.id}_0", reasoning))
        events.output.append(
            events.item("message", f"msg_{events.id}_{len(events.output)}", answer.text.get("content", ""))
        )
        return {**events.final(answer.finish_reason, ending.usage, ending.summary), **ending.judge_usage}


DOOR = Door(
    path=RESPONSES_PATH,
    api=Api.OPENAI,
    parse=parse_responses_body,
    renderer=ResponsesRenderer,
    off_path=RESPONSES_PATH,
    translate=translate,
    shadow_reader=responses_events,
    stream_end=(b"event: response.completed", b"event: response.incomplete", b"event: response.failed"),
    request_model=ResponsesRequest,
    openapi_responses=openai_responses("A Responses API response (JSON), or its SSE events when stream=true."),
    name="responses",
)
