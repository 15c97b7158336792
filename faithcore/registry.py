"""Named implementations, imported on first use: one shape for every "pick it by name" table.

Detectors, regenerators, judge backends and benchmark datasets are all chosen by a name that a user
writes (a header, a setting, a command-line flag). Each table is a `Registry`: a mapping of name to
`Entry`, where an entry names its implementation as a "package.module:attr" string (or just
"package.module" when the module itself is the implementation) with a one-line description. Nothing
is imported until a name is resolved, so listing the table, or using one entry, does not pull in the
dependencies of the others (the judge backends each import a vendor SDK).

`resolve(name)` imports the target and checks that it is what the table holds; an unknown name raises
`UnknownName` with the closest known name as a suggestion.

An entry may also carry a copy of what its target declares that callers read without using it (a
detector's metric labels and per-request options: `Entry.declares`), as it carries the description:
`declared(name, attr)` answers from the copy, importing nothing, and resolves the target only for an
entry that declares no such copy. The registry's own tests keep each copy equal to its target's.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    target: str  # "package.module:attr", or "package.module" for the module itself
    description: str
    # (attribute, value) pairs: what the target declares, copied here to be read without importing it
    # (`Registry.declared`). Pairs, not a dict: an entry stays hashable (a cache may key on entries).
    declares: tuple[tuple[str, Any], ...] = ()

    def declared(self, attr: str) -> tuple[bool, Any]:
        """(True, value) when this entry carries a copy of the target's `attr`, else (False, None)."""
        for name, value in self.declares:
            if name == attr:
                return True, value
        return False, None


class UnknownName(KeyError, ValueError):
    """A name no entry has. A KeyError (it is a failed lookup) and a ValueError (callers that validate
    settings catch that); `hint` is the closest known name, or None."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = list(known)
        matches = difflib.get_close_matches(name, self.known, n=1)
        self.hint = matches[0] if matches else None
        suggestion = f"; did you mean {self.hint!r}?" if self.hint else ""
        self.message = f"unknown {kind} {name!r}{suggestion} (known: {', '.join(self.known)})"
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return self.message


class Registry(dict[str, Entry], Generic[T]):
    """name → Entry, for implementations of one kind.

    `kind` names the kind in messages ("detector"); `base` is the class every target must subclass, or
    `ModuleType` for a table of modules. With `fold_case`, names are looked up lower-cased and stripped
    (dataset names typed on a command line).

    A plain dict underneath: tests may add entries with `monkeypatch.setitem`.
    """

    def __init__(
        self, kind: str, base: type[Any], entries: dict[str, Entry] | None = None, *, fold_case: bool = False
    ) -> None:
        super().__init__(entries or {})
        self.kind = kind
        self.base = base
        self.fold_case = fold_case

    def key(self, name: str) -> str:
        return name.strip().lower() if self.fold_case else name

    def entry(self, name: str) -> Entry:
        """The entry registered as `name`; UnknownName otherwise."""
        entry = self.get(self.key(name))
        if entry is None:
            raise UnknownName(self.kind, name, self)
        return entry

    def resolve(self, name: str) -> T:
        """The implementation registered as `name`, imported; UnknownName, or TypeError when the target
        is not a `base`."""
        entry = self.entry(name)
        module_name, _, attr = entry.target.partition(":")
        target: Any = importlib.import_module(module_name)
        if attr:
            target = getattr(target, attr)
        if self.base is ModuleType:
            ok = isinstance(target, ModuleType)
        else:
            ok = isinstance(target, type) and issubclass(target, self.base)
        if not ok:
            raise TypeError(f"{entry.target} is not a {self.base.__name__}")
        return target  # type: ignore[no-any-return]

    def declared(self, name: str, attr: str) -> Any:
        """The `attr` that the implementation registered as `name` declares: the entry's copy when it
        carries one (nothing is imported), else the attribute of the resolved target."""
        has, value = self.entry(name).declared(attr)
        return value if has else getattr(self.resolve(name), attr)

    def listing(self) -> list[tuple[str, str]]:
        """(name, description) per entry, in registration order, for `faithproxy detectors` and the like;
        imports nothing."""
        return [(name, e.description) for name, e in self.items()]
