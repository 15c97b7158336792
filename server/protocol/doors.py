"""What a door is: one API a client speaks, declared once and read by every room.

A `Door` holds its path (also its metric label `endpoint`), the API family it speaks (its error format,
and how that family's SDK sends its key), the vLLM endpoint its off mode forwards to and the one its
verified rounds call, how its event stream ends, and the pieces of the doors room that serve it (its body
parser, its serving class, its OpenAPI extras). `DoorTable` is the set of doors one app serves:
admission, the limits, the error handlers, metrics, the OpenAPI schema, off mode and the routes all ask
it, so a door added to the table gets all of them. The four doors of the product are declared in
server/doors/table.py; a test may serve a table with a door of its own (tests/server/test_new_door.py).
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


class Api(enum.Enum):
    """The API family a door speaks: OpenAI's error body `{"error": {message, type, param, code}}`, or
    Anthropic's `{"type": "error", "error": {type, message}}`, whose SDK also sends its key as `x-api-key`."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


@dataclass(frozen=True, slots=True)
class Door:
    """One door. `parse` turns the raw body into a dict or raises a PolicyError (400); `translate`, when
    set, turns the admitted body into the chat body a verified mode drives vLLM with (admission applies
    it before the limits and the media-URL policy, so they see what goes upstream); `serving` names the
    serving class ("module:Class", loaded on first use: a server in off mode never imports it)."""

    path: str  # the client's path, and the `endpoint` label of its metrics
    api: Api
    parse: Callable[[bytes], dict[str, Any]]
    serving: str
    off_path: str  # vLLM's endpoint that off mode forwards the client's bytes to
    translate: Callable[[dict[str, Any], str], dict[str, Any]] | None = None  # (body, mode) -> chat body
    stream_end: tuple[bytes, ...] = ()  # the frames that end a complete stream; () for `data: [DONE]`
    openapi_extra: dict[str, Any] = field(default_factory=dict, compare=False)
    openapi_responses: dict[int | str, dict[str, Any]] = field(default_factory=dict, compare=False)
    name: str = "door"  # the OpenAPI operation's id

    def serving_class(self) -> Any:
        module, _, name = self.serving.partition(":")
        return getattr(importlib.import_module(module), name)


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
