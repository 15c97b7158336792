"""What every door's body parser shares: a bounded JSON object validated by the door's request model.

Light on purpose, like admission itself: off mode's pure-ASGI path (server/doors/off.py) parses with the
doors' parsers. A parser refuses what no mode could serve (a PolicyError, 400, nothing sent upstream);
what only the verified modes cannot serve is refused by the door's `translate`, so that `off` still
passes it through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from faithproxy.faithcore.errors import PolicyError
from faithproxy.server.admission.json_guard import load_json
from faithproxy.server.protocol.errors import invalid_body


def json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, else a PolicyError (400)."""
    body = load_json(raw)  # bounded: no recursion or allocation without limit (server/admission/json_guard.py)
    if not isinstance(body, dict):
        raise PolicyError("Request body must be a JSON object", code="invalid_json")
    return body


def body_parser(model: type[BaseModel]) -> Callable[[bytes], dict[str, Any]]:
    """The parser of a door whose body `model` declares: the body as a JSON object, validated by `model`,
    else a PolicyError (400) naming the field.

    The model validates the object json_guard read, and the object itself is what the door serves: its
    unknown fields stay exactly as the client wrote them (no coercion, no re-ordering, no dump), off mode
    forwards the client's bytes, and json_guard's bounds (depth, huge numbers, lone surrogates) hold
    before pydantic sees anything. The model instance is dropped: building the dict back from it would
    cost a dump per request and change what the client sent."""
    validate = model.__pydantic_validator__.validate_python

    def parse(raw: bytes) -> dict[str, Any]:
        body = json_object(raw)
        try:
            validate(body)
        except ValidationError as exc:
            raise invalid_body(exc, model) from None
        return body

    return parse
