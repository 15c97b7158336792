"""The Messages request (Anthropic's API) as the chat request a verified mode drives vLLM with: `system`
becomes the system message, text and image blocks (base64 or url) chat content parts, `max_tokens`
stays, `stop_sequences` is `stop`. Admission applies it (the door's `translate`), so the limits and the
media-URL policy read the chat body once. Light on purpose: the door table imports it, off mode too.
"""

from __future__ import annotations

from typing import Any

from faithproxy.faithcore.errors import PolicyError

_UNSUPPORTED = ("tools", "tool_choice", "mcp_servers", "container")
_PASSED_ON = ("temperature", "top_p", "top_k", "seed")


def _block(block: Any, where: str) -> dict[str, Any]:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    source = block.get("source") if kind == "image" else None
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") if isinstance(source.get("media_type"), str) else "image/png"
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{source['data']}"}}
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise PolicyError(
        f"{where}: only text and image (base64, url) blocks are supported outside X-Faithproxy-Mode: off",
        param="messages",
    )


def _message(message: dict[str, Any], index: int) -> dict[str, Any]:
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise PolicyError(f"messages[{index}].role must be 'user' or 'assistant'", param="messages")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise PolicyError(f"messages[{index}].content must be a string or a list of blocks", param="messages")
    # An earlier turn's thinking, sent back by the client, is the assistant message's `reasoning` (as vLLM's
    # own /v1/messages maps it; the chat template decides whether past thinking is rendered). A
    # redacted_thinking block holds nothing a template could render: left out.
    thinking = [b for b in content if isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")]
    if thinking and role != "assistant":
        raise PolicyError(f"messages[{index}]: thinking blocks belong to assistant messages", param="messages")
    blocks = [
        _block(b, f"messages[{index}].content[{i}]")
        for i, b in enumerate(content)
        if not (isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking"))
    ]
    out: dict[str, Any] = {"role": role, "content": blocks}
    reasoning = "".join(b["thinking"] for b in thinking if isinstance(b.get("thinking"), str))
    if reasoning:
        out["reasoning"] = reasoning
    return out


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    texts = [b.get("text") for b in system if isinstance(b, dict)]
    if not all(isinstance(t, str) for t in texts) or len(texts) != len(system):
        raise PolicyError("'system' blocks must be text blocks", param="system")
    return "\n".join(texts)  # type: ignore[arg-type]


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The Messages request as the chat request vLLM is driven with (a PolicyError for what has none)."""
    messages = [_message(m, i) for i, m in enumerate(body["messages"])]
    if body.get("system"):
        messages.insert(0, {"role": "system", "content": _system_text(body["system"])})
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    chat["stream"] = bool(body.get("stream"))
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    for name in _PASSED_ON:
        if body.get(name) is not None:
            chat[name] = body[name]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        chat["include_reasoning"] = False  # the session reads and checks it, and leaves it out
    return chat


def translate(body: dict[str, Any], mode: str) -> dict[str, Any]:
    """A PolicyError (400) for what a verified chain can't carry (tools), else the chat body."""
    for name in _UNSUPPORTED:
        if body.get(name):
            raise PolicyError(
                f"'{name}' is not supported by the Messages API in {mode} mode "
                "(X-Faithproxy-Mode: off passes it through to vLLM)",
                param=name,
            )
    return chat_body(body)
