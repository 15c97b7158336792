"""The body parsers of the doors beside chat, for `admit` (server/admission/admit.py).

Light on purpose, like admission itself: off mode's pure-ASGI path (server/doors/off.py) parses with
them. A parser refuses what no mode could serve (a PolicyError, 400, nothing sent upstream); what only
the correcting modes cannot serve is refused by the door's serving object, so that `off` still passes it
through.
"""

from __future__ import annotations

from typing import Any

from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.admission.admit import _json_object, _model_and_stream


def _is_prompt(prompt: Any) -> bool:
    """A completions prompt as OpenAI takes it: a string, or a non-empty list of strings, of token ids,
    or of token-id lists."""
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    return (
        all(isinstance(p, str) for p in prompt)
        or all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        or all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt)
    )


def parse_completions_body(raw: bytes) -> dict[str, Any]:
    """A /v1/completions body, else a PolicyError (400). Unknown fields pass through untouched."""
    body = _json_object(raw)
    if "prompt" not in body or not _is_prompt(body["prompt"]):
        raise PolicyError("'prompt' must be a string, or a non-empty list of strings or of token ids", param="prompt")
    return _model_and_stream(body)


def parse_responses_body(raw: bytes) -> dict[str, Any]:
    """A /v1/responses (OpenAI Responses API) body, else a PolicyError (400). Unknown fields pass through."""
    body = _json_object(raw)
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
    return _model_and_stream(body)


def parse_messages_body(raw: bytes) -> dict[str, Any]:
    """An Anthropic /v1/messages body, else a PolicyError (400; the door answers in Anthropic's format)."""
    body = _json_object(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise PolicyError("'messages' must be a non-empty list of message objects", param="messages")
    limit = body.get("max_tokens")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise PolicyError("'max_tokens' is required and must be a positive integer", param="max_tokens")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise PolicyError("'system' must be a string or a list of text blocks", param="system")
    return _model_and_stream(body)
