"""The Responses request (OpenAI's Responses API) as the chat request a verified mode drives vLLM with:
`instructions` become the system message, `input` items the messages, `input_image` parts image_url
parts, `max_output_tokens` the max_tokens. The Responses API offers no way to continue a partial
message, so a verified chain runs as chat. Admission applies it (the door's `translate`), so the limits
and the media-URL policy read the chat body once. Light on purpose: the door table imports it.
"""

from __future__ import annotations

from typing import Any

from faithproxy.faithcore.errors import PolicyError

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
