"""The OpenAPI of every door: what they share (the X-Faithproxy-* headers, OpenAI's error responses, the
open base model) and `install_openapi`, which adds each door's request model (`Door.request_model`, in
its module) as a component.

Each door's request model is its parser too (server/doors/bodies.py `body_parser`), its OpenAPI and the
fuzzer's grammar: it lists what the proxy itself reads, and `extra="allow"` lets everything else through
(forwarded to vLLM byte for byte in off mode, and as parsed JSON otherwise).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

from faithproxy.detectors.registry import DETECTORS
from faithproxy.faithcore.reasoning_formats import FORMATS
from faithproxy.server.admission.policy import (
    HEADER_ANNOTATE,
    HEADER_DETECTOR,
    HEADER_JUDGE,
    HEADER_MAX_RETRIES,
    HEADER_MODE,
    HEADER_ON_DETECTOR_ERROR,
    HEADER_REASONING_FORMAT,
)
from faithproxy.server.protocol.doors import Door, DoorTable
from faithproxy.server.protocol.errors import ErrorResponse
from faithproxy.server.settings import Settings


def _no_explicit_additional_properties(schema: dict[str, Any]) -> None:
    # Absent means the same as `true` in JSON Schema; said explicitly, it makes fuzzers spend their
    # time generating arbitrary extra members instead of exercising the fields the proxy reads.
    schema.pop("additionalProperties", None)


class OpenModel(BaseModel):
    """A wire model that reads what the proxy reads and lets everything else through (STYLE.md, 8).
    Strict, as JSON is typed: a string is no boolean and a float no integer."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_no_explicit_additional_properties)


def _is_none(value: Any) -> bool:
    return value is None


def Absent() -> Any:  # noqa: N802 - used as a field's default, like pydantic's Field
    """A response field left out of the JSON while it is None (OpenAI's chunks carry `usage` only on the
    usage chunk), where a field declared plainly is written as null (`finish_reason`, `logprobs`)."""
    return Field(default=None, exclude_if=_is_none)


# A token limit: a positive integer, which JSON Schema and vLLM also write 256.0; admission's check_body
# (server/admission/limits.py) makes it an int and holds it under this server's cap.
TokenLimit = Annotated[int, Field(ge=1, strict=False)]


class DoorRequest(OpenModel):
    """What every door's body holds: the model, and whether to stream (null means false, as for OpenAI)."""

    model: str = Field(min_length=1)
    stream: bool | None = False


class StreamOptions(OpenModel):
    include_usage: bool | None = None


def _header(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description, "schema": schema}


def chat_parameters(settings: Settings, served: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The X-Faithproxy-* headers, with the values this server accepts: `served` names the detectors it
    built; without it (no lifespan has run yet), the available ones minus those needing an absent judge."""
    if served is None:
        served = [name for name in DETECTORS if settings.judges or not DETECTORS.resolve(name).uses_judge]
    detectors = sorted(served)
    parameters = [
        _header(HEADER_MODE, "correct | detect | off", {"type": "string", "enum": ["correct", "detect", "off"]}),
        _header(HEADER_DETECTOR, "The detector checking the steps.", {"type": "string", "enum": detectors}),
        _header(
            HEADER_MAX_RETRIES, "Regeneration tries per unfaithful step.", {"type": "string", "pattern": "^(10|[0-9])$"}
        ),
        _header(HEADER_ON_DETECTOR_ERROR, "pass | fail", {"type": "string", "enum": ["pass", "fail"]}),
        _header(HEADER_ANNOTATE, "true | false", {"type": "string", "enum": ["true", "false"]}),
        _header(
            HEADER_REASONING_FORMAT,
            "The served model's reasoning format (docs/reasoning-models.md); the server's setting otherwise.",
            {"type": "string", "enum": list(FORMATS)},
        ),
    ]
    if settings.judges:
        names = [judge.name for judge in settings.judges]
        parameters.append(
            _header(HEADER_JUDGE, "A judge configured on this server.", {"type": "string", "enum": names})
        )
    return parameters


def openai_responses(ok: str, model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The responses of an OpenAI door: its 200 is `model` (`ok` says so, and what it streams); its errors
    are OpenAI's."""
    return {
        200: {"model": model, "description": ok},
        400: {"model": ErrorResponse, "description": "Invalid body, header or image."},
        401: {"model": ErrorResponse, "description": "Missing or wrong API key."},
        403: {"model": ErrorResponse, "description": "A header outside the API key's policy (FAITHPROXY_POLICY_FILE)."},
        413: {"model": ErrorResponse, "description": "Body or image too large."},
        429: {"model": ErrorResponse, "description": "Too many concurrent requests (see Retry-After)."},
        431: {"model": ErrorResponse, "description": "Request headers too large."},
        502: {"model": ErrorResponse, "description": "vLLM or the detector failed."},
    }


def request_body(door: Door) -> dict[str, Any]:
    """The route's OpenAPI extra: its request body, the door's model (a component `install_openapi` adds)."""
    if door.request_model is None:
        return {}
    ref = f"#/components/schemas/{door.request_model.__name__}"
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": ref}}}}}


def _capped(request: dict[str, Any], cap: int) -> None:
    """This server's max_tokens cap as the maximum of the optional token limits a request model has."""
    for name in ("max_tokens", "max_completion_tokens"):
        limit = request["properties"].get(name)
        if limit is not None and "anyOf" in limit:
            limit["anyOf"][0]["maximum"] = cap


def install_openapi(app: FastAPI, settings: Settings, doors: DoorTable) -> None:
    """Adds the request models (pydantic's $defs become components), the headers with this server's
    values, its max_tokens cap and, when keys are configured, the bearer security scheme."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for door in doors:
                if door.request_model is None:
                    continue
                request = door.request_model.model_json_schema(ref_template="#/components/schemas/{model}")
                if settings.max_tokens_cap is not None:
                    _capped(request, settings.max_tokens_cap)
                schemas.update(request.pop("$defs", {}))
                schemas[door.request_model.__name__] = request
            state = getattr(app.state, "faithproxy", None)
            for door in doors:
                if door.path in schema["paths"]:
                    operation = schema["paths"][door.path]["post"]
                    operation["parameters"] = chat_parameters(settings, state.detectors if state is not None else None)
            if settings.api_keys:
                schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                schema["security"] = [{"bearer": []}]
                for path in ("/healthz", "/readyz") + (() if settings.metrics_require_key else ("/metrics",)):
                    schema["paths"][path]["get"]["security"] = []
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
