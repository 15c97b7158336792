"""What every door's body parser shares: a bounded JSON object, then `model` and `stream`.

Light on purpose, like admission itself: off mode's pure-ASGI path (server/doors/off.py) parses with the
doors' parsers. A parser refuses what no mode could serve (a PolicyError, 400, nothing sent upstream);
what only the verified modes cannot serve is refused by the door's `translate`, so that `off` still
passes it through.
"""

from __future__ import annotations

from typing import Any

from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.admission.json_guard import load_json


def json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, else a PolicyError (400)."""
    body = load_json(raw)  # bounded: no recursion or allocation without limit (server/admission/json_guard.py)
    if not isinstance(body, dict):
        raise PolicyError("Request body must be a JSON object", code="invalid_json")
    return body


def model_and_stream(body: dict[str, Any]) -> dict[str, Any]:
    """The checks every door's body shares after its own: `model` and `stream`."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise PolicyError("'model' must be a non-empty string", param="model")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise PolicyError("'stream' must be a boolean", param="stream")  # null means false, as for OpenAI
    return body
