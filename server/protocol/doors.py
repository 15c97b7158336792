"""What a door is: one API a client speaks, declared once and read by every room.

A `Door` holds its path (also its metric label `endpoint`), the API family it speaks (its error format,
and how that family's SDK sends its key), its body parser, its translation to the chat body a verified
mode drives (and the messages detectors read of it), its renderer (server/protocol/render.py), its wires
(server/protocol/wires.py: how its rounds talk to vLLM, how the shadow check reads its off responses),
the vLLM endpoint its off mode forwards to, how its event stream ends, and its OpenAPI (its request
model and its responses). `DoorTable` is the set of doors one app serves: admission, the limits, the
error handlers, metrics, the OpenAPI schema, off mode, the routes and the shadow check all ask it, so a
door added to the table gets all of them. Each door of the product is one module of server/doors/
(chat.py, completions.py, responses.py, messages.py) and one line of server/doors/table.py; a test may
serve a table with a door of its own (tests/server/test_new_door.py).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from faithproxy.server.protocol.render import Renderer
from faithproxy.server.protocol.wires import RoundWire, ShadowReader


class Api(enum.Enum):
    """The API family a door speaks: OpenAI's error body `{"error": {message, type, param, code}}`, or
    Anthropic's `{"type": "error", "error": {type, message}}`, whose SDK also sends its key as `x-api-key`."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages of a chat body: what detectors, judges and the regenerator read."""
    messages: list[dict[str, Any]] = body["messages"]
    return messages


@dataclass(frozen=True, slots=True)
class Door:
    """One door. `parse` turns the raw body into a dict or raises a PolicyError (400): the product's doors
    make it of their `request_model` (server/doors/bodies.py `body_parser`); `translate`, when
    set, turns the admitted body into the chat body a verified mode drives vLLM with, or refuses (a
    PolicyError) what a verified chain cannot serve (admission applies it in a verified mode, after the
    limits and the media-URL policy, so they see the client's body; the shadow check applies it to what
    it replays); `messages` reads what detectors read of the (translated) body; `renderer` writes the
    door's responses."""

    path: str  # the client's path, and the `endpoint` label of its metrics
    api: Api
    parse: Callable[[bytes], dict[str, Any]]
    renderer: type[Renderer]
    off_path: str  # vLLM's endpoint that off mode forwards the client's bytes to
    translate: Callable[[dict[str, Any], str], dict[str, Any]] | None = None  # (body, mode) -> chat body
    messages: Callable[[dict[str, Any]], list[dict[str, Any]]] = chat_messages
    hints: bool = True  # whether the hint stage (X-Faithproxy-Hints) may rewrite its messages
    round_wire: RoundWire | None = None  # None: its rounds are chat's (server/chain/session.py CHAT_WIRE)
    shadow_reader: ShadowReader | None = None  # None: a sampled off request of it is counted unreadable
    stream_end: tuple[bytes, ...] = ()  # the frames that end a complete stream; () for `data: [DONE]`
    request_model: type[BaseModel] | None = None  # its body: what `parse` validates with, and its OpenAPI
    openapi_responses: dict[int | str, dict[str, Any]] = field(default_factory=dict, compare=False)
    name: str = "door"  # the OpenAPI operation's id


class DoorTable:
    """The doors one app serves, by path."""

    def __init__(self, doors: Iterable[Door]) -> None:
        self._by_path: dict[str, Door] = {}
        for door in doors:
            if door.path in self._by_path:
                raise ValueError(f"two doors at {door.path}")
            self._by_path[door.path] = door

    def __iter__(self) -> Iterator[Door]:
        return iter(self._by_path.values())

    def __len__(self) -> int:
        return len(self._by_path)

    def get(self, path: str) -> Door | None:
        return self._by_path.get(path)

    def __getitem__(self, path: str) -> Door:
        return self._by_path[path]

    @property
    def paths(self) -> tuple[str, ...]:
        """The doors' paths: also the label values of the `endpoint` label."""
        return tuple(self._by_path)

    def with_doors(self, *doors: Door) -> DoorTable:
        """This table and `doors` (a new door, or a replacement at an existing path)."""
        return DoorTable([*(d for d in self if d.path not in {n.path for n in doors}), *doors])
