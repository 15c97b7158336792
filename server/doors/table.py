"""The product's doors, each declared once: its path, the API it speaks, how its body is read and, in a
verified mode, turned into chat, the class that serves it, the vLLM endpoint its off mode forwards to,
how its stream ends and its OpenAPI extras. Everything else (admission, limits, errors, metrics, the
schema, off mode, the routes) reads this table through the app (`create_app(doors=...)`).

Chat and completions mirror vLLM's endpoints of the same path, so they name the vLLM client's paths;
the Responses and Messages doors have paths of their own and, in a verified mode, run as chat.
"""

from __future__ import annotations

from faithproxy.clients.vllm import CHAT_PATH, COMPLETIONS_PATH
from faithproxy.server.admission.admit import parse_chat_body
from faithproxy.server.doors import messages_to_chat, responses_to_chat, schema
from faithproxy.server.doors.bodies import parse_completions_body, parse_messages_body, parse_responses_body
from faithproxy.server.protocol.doors import Api, Door, DoorTable

RESPONSES_PATH = "/v1/responses"
MESSAGES_PATH = "/v1/messages"

CHAT = Door(
    path=CHAT_PATH,
    api=Api.OPENAI,
    parse=parse_chat_body,
    serving="faithproxy.server.doors.serving:ChatServing",
    off_path=CHAT_PATH,
    openapi_extra=schema.CHAT_OPENAPI_EXTRA,
    openapi_responses=schema.CHAT_RESPONSES,
    name="chat_completions",
)
COMPLETIONS = Door(
    path=COMPLETIONS_PATH,
    api=Api.OPENAI,
    parse=parse_completions_body,
    serving="faithproxy.server.doors.completions:CompletionServing",
    off_path=COMPLETIONS_PATH,
    openapi_extra=schema.COMPLETIONS_OPENAPI_EXTRA,
    openapi_responses=schema.COMPLETIONS_RESPONSES,
    name="completions",
)
RESPONSES = Door(
    path=RESPONSES_PATH,
    api=Api.OPENAI,
    parse=parse_responses_body,
    translate=responses_to_chat.translate,
    serving="faithproxy.server.doors.responses:ResponsesServing",
    off_path=RESPONSES_PATH,
    stream_end=(b"event: response.completed", b"event: response.incomplete", b"event: response.failed"),
    openapi_extra=schema.RESPONSES_OPENAPI_EXTRA,
    openapi_responses=schema.RESPONSES_RESPONSES,
    name="responses",
)
MESSAGES = Door(
    path=MESSAGES_PATH,
    api=Api.ANTHROPIC,
    parse=parse_messages_body,
    translate=messages_to_chat.translate,
    serving="faithproxy.server.doors.messages:MessagesServing",
    off_path=MESSAGES_PATH,
    stream_end=(b"event: message_stop",),
    openapi_extra=schema.MESSAGES_OPENAPI_EXTRA,
    openapi_responses=schema.MESSAGES_RESPONSES,
    name="messages",
)

DOORS = DoorTable([CHAT, COMPLETIONS, RESPONSES, MESSAGES])
