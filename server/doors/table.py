"""The product's doors, one line each. A door is one module of this room (chat.py, completions.py,
responses.py, messages.py): its body parser, its translation to chat, its renderer, its wires, its
OpenAPI and its `Door`, which everything else (admission, limits, errors, metrics, the schema, off mode,
the routes, the shadow check) reads through the app (`create_app(doors=...)`).
"""

from __future__ import annotations

from faithproxy.server.doors import chat, completions, messages, responses
from faithproxy.server.protocol.doors import DoorTable

DOORS = DoorTable(
    [
        chat.DOOR,
        completions.DOOR,
        responses.DOOR,
        messages.DOOR,
    ]
)
