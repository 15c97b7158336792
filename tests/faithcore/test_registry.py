"""The one registry shape: lazy "module:attr" entries, a suggestion on a typo, planned entries refused."""

from __future__ import annotations

import collections
import json
import sys
from types import ModuleType

import pytest

from faithproxy.faithcore.registry import Entry, Registry, UnknownName


def mappings() -> Registry[type[dict]]:
    return Registry(
        "mapping",
        dict,
        {
            "ordered": Entry("collections:OrderedDict", "remembers insertion order"),
            "counter": Entry("collections:Counter", "counts"),
            "decoder": Entry("json:JSONDecoder", "not a mapping at all"),
        },
    )


def test_resolve_imports_and_returns_the_target() -> None:
    assert mappings().resolve("ordered") is collections.OrderedDict
    assert mappings().resolve("counter") is collections.Counter


def test_entries_are_imported_only_when_resolved() -> None:
    sys.modules.pop("colorsys", None)
    table: Registry[type[object]] = Registry("thing", object, {"hls": Entry("colorsys:hls_to_rgb", "x")})
    assert table.listing() == [("hls", "x")] and "colorsys" not in sys.modules
    with pytest.raises(TypeError, match="colorsys:hls_to_rgb is not a object"):
        table.resolve("hls")  # a function, not a class
    assert "colorsys" in sys.modules


def test_unknown_name_suggests_the_closest_and_is_a_key_and_value_error() -> None:
    with pytest.raises(UnknownName) as info:
        mappings().resolve("orderd")
    error = info.value
    assert isinstance(error, KeyError) and isinstance(error, ValueError)
    assert error.hint == "ordered" and error.kind == "mapping" and error.name == "orderd"
    assert str(error) == "unknown mapping 'orderd'; did you mean 'ordered'? (known: ordered, counter, decoder)"
    assert error.args[0] == str(error)  # callers that re-raise args[0] get the same sentence
    with pytest.raises(UnknownName) as info:
        mappings().resolve("zzz")
    assert info.value.hint is None and "did you mean" not in str(info.value)


def test_a_target_of_the_wrong_kind_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="json:JSONDecoder is not a dict"):
        mappings().resolve("decoder")


def test_a_table_of_modules_with_folded_case() -> None:
    table: Registry[ModuleType] = Registry("module", ModuleType, {"json": Entry("json", "JSON")}, fold_case=True)
    assert table.resolve(" JSON ") is json
    table["decoder"] = Entry("json:JSONDecoder", "a class, not a module")  # tests patch entries in like this
    with pytest.raises(TypeError, match="json:JSONDecoder is not a module"):
        table.resolve("decoder")
