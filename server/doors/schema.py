"""The OpenAPI description of POST /v1/chat/completions and /v1/completions: request bodies, headers, errors.

The handler reads the raw body (unknown fields are forwarded to vLLM byte for byte in off mode, and
as parsed JSON otherwise), so these models are documentation and the fuzzer's grammar, not a parser:
they list what the proxy itself reads, and `extra="allow"` says that everything else passes through.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

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
from faithproxy.server.protocol.doors import DoorTable
from faithproxy.server.settings import Settings


def _no_explicit_additional_properties(schema: dict[str, Any]) -> None:
    # Absent means the same as `true` in JSON Schema; said explicitly, it makes fuzzers spend their
    # time generating arbitrary extra members instead of exercising the fields the proxy reads.
    schema.pop("additionalProperties", None)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=_no_explicit_additional_properties)


class ImageURL(_Open):
    url: str = Field(description="A base64 data: URL or an http(s) URL.")
    detail: str | None = None


class TextPart(_Open):
    type: Literal["text"]
    text: str


class ImagePart(_Open):
    type: Literal["image_url"]
    image_url: ImageURL


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImagePart] | None = None


class StreamOptions(_Open):
    include_usage: bool | None = None


class ChatCompletionRequest(_Open):
    """An OpenAI chat completion request; fields not listed are forwarded to vLLM untouched."""

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=1, ge=1, description="Only 1 unless X-Faithproxy-Mode is off.")
    temperature: float | None = None
    seed: int | None = None


class CompletionRequest(_Open):
    """An OpenAI (legacy) completion request; fields not listed are forwarded to vLLM untouched."""

    model: str = Field(min_length=1)
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="One string unless X-Faithproxy-Mode is off (then anything vLLM takes)."
    )
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=1, ge=1, description="Only 1 unless X-Faithproxy-Mode is off.")
    temperature: float | None = None
    seed: int | None = None


class ResponsesRequest(_Open):
    """An OpenAI Responses API request; fields not listed are forwarded to vLLM untouched in off mode."""

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(
        description="A string or message items (input_text, input_image parts) unless X-Faithproxy-Mode is off."
    )
    instructions: str | None = None
    stream: bool | None = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None


class AnthropicText(_Open):
    type: Literal["text"]
    text: str


class AnthropicImageSource(_Open):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class AnthropicImage(_Open):
    type: Literal["image"]
    source: AnthropicImageSource


class AnthropicMessage(_Open):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicText | AnthropicImage]


class MessagesRequest(_Open):
    """An Anthropic Messages API request; fields not listed are forwarded to vLLM untouched in off mode."""

    model: str = Field(min_length=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stream: bool | None = False
    temperature: float | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def _header(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description, "schema": schema}


CHAT_OPENAPI_EXTRA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}},
    },
}


COMPLETIONS_OPENAPI_EXTRA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CompletionRequest"}}},
    },
}


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


CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "A chat completion (JSON), or an SSE stream when stream=true."},
    400: {"model": ErrorResponse, "description": "Invalid body, header or image."},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key."},
    403: {"model": ErrorResponse, "description": "A header outside the API key's policy (FAITHPROXY_POLICY_FILE)."},
    413: {"model": ErrorResponse, "description": "Body or image too large."},
    429: {"model": ErrorResponse, "description": "Too many concurrent requests (see Retry-After)."},
    431: {"model": ErrorResponse, "description": "Request headers too large."},
    502: {"model": ErrorResponse, "description": "vLLM or the detector failed."},
}


COMPLETIONS_RESPONSES: dict[int | str, dict[str, Any]] = {
    **CHAT_RESPONSES,
    200: {"description": "A text completion (JSON), or an SSE stream when stream=true."},
}

RESPONSES_OPENAPI_EXTRA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ResponsesRequest"}}},
    },
}

MESSAGES_OPENAPI_EXTRA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/MessagesRequest"}}},
    },
}

MESSAGES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "An Anthropic message (JSON), or its SSE events when stream=true."},
    400: {"description": "Invalid body, header or image (Anthropic's error format)."},
    401: {"description": "Missing or wrong API key."},
    413: {"description": "Body or image too large."},
    429: {"description": "Too many concurrent requests (see Retry-After)."},
    502: {"description": "vLLM or the detector failed."},
}

RESPONSES_RESPONSES: dict[int | str, dict[str, Any]] = {
    **CHAT_RESPONSES,
    200: {"description": "A Responses API response (JSON), or its SSE events when stream=true."},
}


def install_openapi(app: FastAPI, settings: Settings, doors: DoorTable) -> None:
    """Adds the request models (pydantic's $defs become components), the headers with this server's
    values, its max_tokens cap and, when keys are configured, the bearer security scheme."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            request = ChatCompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            if settings.max_tokens_cap is not None:
                for name in ("max_tokens", "max_completion_tokens"):
                    request["properties"][name]["anyOf"][0]["maximum"] = settings.max_tokens_cap
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(request.pop("$defs", {}))
            components["schemas"]["ChatCompletionRequest"] = request
            completion = CompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            if settings.max_tokens_cap is not None:
                completion["properties"]["max_tokens"]["anyOf"][0]["maximum"] = settings.max_tokens_cap
            components["schemas"].update(completion.pop("$defs", {}))
            components["schemas"]["CompletionRequest"] = completion
            components["schemas"]["ResponsesRequest"] = ResponsesRequest.model_json_schema()
            messages = MessagesRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            components["schemas"].update(messages.pop("$defs", {}))
            components["schemas"]["MessagesRequest"] = messages
            state = getattr(app.state, "faithproxy", None)
            for door in doors:
                if door.path in schema["paths"]:
                    operation = schema["paths"][door.path]["post"]
                    operation["parameters"] = chat_parameters(settings, state.detectors if state is not None else None)
            if settings.api_keys:
                components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                schema["security"] = [{"bearer": []}]
                for path in ("/healthz", "/readyz") + (() if settings.metrics_require_key else ("/metrics",)):
                    schema["paths"][path]["get"]["security"] = []
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
