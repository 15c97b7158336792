"""The import rule of the house, read off the real import graph: each module references only what its
layer allows.

    faithcore (with faithcore.correction)   the pure domain: itself and the standard library minus I/O
    clients                                  faithcore, clients
    detectors                                faithcore, clients, detectors
    regenerators                             faithcore, clients, generic detectors, regenerators
    server                                   faithcore, clients, generic detectors and regenerators, server
    testing (faithproxy.testing)             the product layers above, testing
    flywheel                                 the product layers above, flywheel (pairs, tuning)
    the lab, benchmarks/:
      tinyvlm → shapesworld → benchmarks     the product, testing, flywheel, and the lab's rooms below
    faithproxy (cli.py, demo.py)             the top: assembles the command, may use anything

"Generic" is the plug-in rule: `detectors.<name>` is a specific detector, which regenerators/ and server/
may not name, when detectors/registry.py registers it (a "faithproxy.detectors.<name>:Class" entry) or a
registered detector class is defined in it; every other detectors module (base, registry, options,
features...) is generic. The same holds for regenerators/ and regenerators/registry.py. So the server asks
the registries, and adding a detector touches its own file and the registry, nothing in server/.

A reference counts whether it is an import statement (anywhere: inside functions and TYPE_CHECKING
blocks too) or a string naming a module (`"faithproxy.benchmarks.standins.judge_server"` handed to
`python -m`, a lazy registry entry "faithproxy.detectors.judge:JudgeDetector", a docstring that tells
the reader to run one). Bare top-level names (`import server`) are refused everywhere: they import the
repo's folders as unrelated packages, beside the installed `faithproxy.server`; relative imports too.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
# The folders installed under faithproxy (pyproject.toml's package-dir); faithproxy/ holds the command and
# faithproxy.testing.
FOLDERS = ("faithcore", "clients", "detectors", "regenerators", "server", "flywheel", "benchmarks")
# The lab's rooms below the rest of benchmarks/: a layer each, named by their folder.
LAB_ROOMS = {"faithproxy.benchmarks.tinyvlm": "tinyvlm", "faithproxy.benchmarks.shapesworld": "shapesworld"}
LAYER_FOLDERS = {
    **{folder: folder for folder in FOLDERS},
    "tinyvlm": "benchmarks/tinyvlm",
    "shapesworld": "benchmarks/shapesworld",
}
PLUGIN_LAYERS = {"detectors": "detectors/registry.py", "regenerators": "regenerators/registry.py"}

ALL, GENERIC = "all", "generic"  # how much of a layer another layer may reference
PRODUCT = {"faithcore": ALL, "clients": ALL, "detectors": ALL, "regenerators": ALL, "server": ALL}
# Layer -> {layer it may reference: ALL of it, or only its GENERIC modules}.
ALLOWED: dict[str, dict[str, str]] = {
    "faithcore": {"faithcore": ALL},
    "clients": {"faithcore": ALL, "clients": ALL},
    "detectors": {"faithcore": ALL, "clients": ALL, "detectors": ALL},
    "regenerators": {"faithcore": ALL, "clients": ALL, "detectors": GENERIC, "regenerators": ALL},
    "server": {"faithcore": ALL, "clients": ALL, "detectors": GENERIC, "regenerators": GENERIC, "server": ALL},
    "testing": PRODUCT | {"testing": ALL},
    # the flywheel reads what the proxy recorded as JSON: it needs none of the server
    "flywheel": PRODUCT | {"flywheel": ALL},
    "tinyvlm": PRODUCT | {"testing": ALL, "flywheel": ALL, "tinyvlm": ALL},
    "shapesworld": PRODUCT | {"testing": ALL, "flywheel": ALL, "tinyvlm": ALL, "shapesworld": ALL},
    "benchmarks": PRODUCT | {"testing": ALL, "flywheel": ALL, "tinyvlm": ALL, "shapesworld": ALL, "benchmarks": ALL},
}
ALLOWED["command"] = {layer: ALL for layer in [*ALLOWED, "command"]}
# The standard library's and the world's I/O, which the pure domain never touches (numpy, nltk are fine).
IO_MODULES = (
    "asyncio", "anyio", "trio", "socket", "ssl", "selectors", "socketserver", "urllib.request",
    "httpx", "httptools", "aiohttp", "requests", "fastapi", "starlette", "uvicorn",
)  # fmt: skip
NO_IO_LAYERS = {"faithcore"}

# A string counts when it names a module of a layer's folder: `python -m faithproxy.cli` runs the installed
# command as a process, which any layer may do, and "faithproxy.requests" may be a logger's name.
_MODULE_IN_TEXT = re.compile(r"(?<![\w.])faithproxy\.(?:{})(?:\.\w+)*".format("|".join([*FOLDERS, "testing"])))
_BARE = re.compile(r"^({})(\.|$)".format("|".join(FOLDERS)))


class Reference(NamedTuple):
    line: int
    name: str  # a dotted module path, or ".x" for a relative import


def layer_of(module: str) -> str | None:
    """The layer a `faithproxy....` module belongs to; None for the bare namespace and anything else."""
    parts = module.split(".")
    if parts[0] != "faithproxy" or len(parts) == 1:
        return None
    for prefix, room in LAB_ROOMS.items():
        if module == prefix or module.startswith(prefix + "."):
            return room
    if parts[1] in FOLDERS or parts[1] == "testing":
        return parts[1]
    return "command"  # faithproxy.cli, faithproxy.demo


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts[1:] if rel.parts[0] == "faithproxy" else rel.parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(["faithproxy", *parts])


def _python_files(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


@functools.cache
def product_files() -> dict[str, Path]:
    """Every module of the installed package, by its dotted name."""
    paths = [p for folder in (*FOLDERS, "faithproxy") for p in _python_files(folder)]
    return {_module_name(path): path for path in paths}


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _from_import(node: ast.ImportFrom, known: dict[str, Path]) -> Iterator[str]:
    """`from a.b import c` references a.b.c where c is a module, else the name c of a.b (once)."""
    names = {f"{node.module}.{alias.name}" for alias in node.names}
    yield from sorted(names & known.keys())
    if names - known.keys():
        yield node.module or ""


def references(tree: ast.Module, known: dict[str, Path]) -> list[Reference]:
    """Every module this syntax tree imports (anywhere) or names in a string."""
    found: list[Reference] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Reference(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append(Reference(node.lineno, "." * node.level + (node.module or "")))
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [Reference(node.lineno, name) for name in _from_import(node, known)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [Reference(node.lineno, m.group(0)) for m in _MODULE_IN_TEXT.finditer(node.value)]
    return found


def _defining_modules(module: str, cls: str, known: dict[str, Path]) -> set[str]:
    """`module` and, where `cls` is imported into it rather than defined, the module that defines it."""
    found = {module}
    if module not in known:
        return found
    for node in _parse(known[module]).body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.asname or a.name == cls for a in node.names):
            found |= _defining_modules(node.module, cls, known)
    return found


@functools.cache
def specific_modules() -> frozenset[str]:
    """The modules of registered plug-ins: their registry entries' modules and where their classes live."""
    known = product_files()
    found: set[str] = set()
    for layer, registry in PLUGIN_LAYERS.items():
        entry = re.compile(rf"^(faithproxy\.{layer}\.[\w.]+):(\w+)$")
        for node in ast.walk(_parse(REPO / registry)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := entry.match(node.value)):
                found |= _defining_modules(m.group(1), m.group(2), known)
    return frozenset(found)


def _target(name: str, known: dict[str, Path]) -> str:
    """The longest known module `name` is in (a string may name `module:attr` or a module's attribute)."""
    parts = name.split(".")
    for end in range(len(parts), 1, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return name


def _io(name: str) -> bool:
    return any(name == io or name.startswith(io + ".") for io in IO_MODULES)


def _problem(name: str, layer: str, specific: frozenset[str], known: dict[str, Path]) -> str | None:
    """Why referencing `name` from a module of `layer` breaks the rule, None when it does not."""
    if name.startswith("."):
        return f"relative import {name!r} (write the faithproxy.… path)"
    if _BARE.match(name):
        return f"bare top-level import {name!r} (write faithproxy.{name})"
    if layer in NO_IO_LAYERS and _io(name):
        return f"{name!r} is I/O, which the pure domain never does"
    target = _target(name, known)
    other = layer_of(target)
    if other is None or (other == "command" and target not in known):
        return None  # not a module of faithproxy (a logger or metric name in a string, the bare namespace)
    reach = ALLOWED[layer].get(other)
    if reach is None:
        return f"{name!r}: {layer}/ may not reference {other}"
    if reach == GENERIC and target in specific:
        return f"{name!r} is a specific plug-in: {layer}/ asks the registry"
    return None


@functools.cache
def file_references(path: Path) -> tuple[Reference, ...]:
    """A file's references, read once for every test that asks. Its syntax tree is not kept: holding
    every file's tree alive makes each garbage collection walk millions of nodes (3x the test's time)."""
    return tuple(references(_parse(path), product_files()))


def violations(refs: Iterable[Reference], rel: str, module: str) -> list[str]:
    """What in `refs` (of the file shown as `rel`, the module `module`) breaks its layer's rule."""
    layer = "command" if module == "faithproxy" else layer_of(module)  # the package's own __init__
    assert layer is not None, module
    known, specific = product_files(), specific_modules()
    problems = []
    for line, name in refs:
        problem = _problem(name, layer, specific, known)
        if problem is not None:
            problems.append(f"{rel}:{line}: {problem}")
    return problems


@pytest.mark.parametrize("layer", [*LAYER_FOLDERS, "faithproxy"])
def test_every_module_references_only_what_its_layer_allows(layer: str) -> None:
    folder = LAYER_FOLDERS.get(layer, layer)
    nested = [REPO / inner for inner in LAYER_FOLDERS.values() if inner.startswith(folder + "/")]  # their own layer
    modules = {
        name: path
        for name, path in product_files().items()
        if path.is_relative_to(REPO / folder) and not any(path.is_relative_to(n) for n in nested)
    }
    assert modules, f"no Python files under {folder}/"
    problems = [
        problem
        for name, path in modules.items()
        for problem in violations(file_references(path), str(path.relative_to(REPO)), name)
    ]
    assert not problems, "\n".join(problems)


def test_the_registries_name_specific_plugins() -> None:
    """The generic rule has something to hold: the registries' entries are found, each a real module."""
    specific = specific_modules()
    assert {"faithproxy.detectors.probe", "faithproxy.detectors.judge", "faithproxy.detectors.cascade"} <= specific
    assert "faithproxy.regenerators.reflect" in specific
    assert not {"faithproxy.detectors.base", "faithproxy.detectors.registry"} & specific
    assert specific <= set(product_files()), sorted(specific - set(product_files()))


def test_tests_and_scripts_use_the_namespace() -> None:
    """Tests, deploy files and scripts may import any layer, but only through `faithproxy.`."""
    files = _python_files("tests") + _python_files("deploy") + _python_files("scripts")
    rel = {path: str(path.relative_to(REPO)) for path in files}
    problems = [p for path in files for p in violations(file_references(path), rel[path], "faithproxy.cli")]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        # a server module that names one detector (the back door issue 28 closes)
        ("from faithproxy.detectors.probe import Probe\n", "faithproxy.server.chain.session", "specific plug-in"),
        ("from faithproxy.detectors import probe\n", "faithproxy.server.app", "specific plug-in"),
        (
            "X = 'faithproxy.detectors.cascade:CascadeDetector'\n",
            "faithproxy.server.observe.metrics",
            "specific plug-in",
        ),
        (
            "from faithproxy.regenerators.reflect import ReflectRegenerator\n",
            "faithproxy.server.app",
            "specific plug-in",
        ),
        ("from faithproxy.detectors.judge import JudgeDetector\n", "faithproxy.regenerators.base", "specific plug-in"),
        # the pure core: no I/O, nothing above it
        ("import asyncio\n", "faithproxy.faithcore.correction.machine", "is I/O"),
        ("def f():\n    from asyncio import Queue\n", "faithproxy.faithcore.segmenter", "is I/O"),
        ("import httpx\n", "faithproxy.faithcore.correction.rules", "is I/O"),
        ("from faithproxy.server.x import y\n", "faithproxy.faithcore.types", "may not reference server"),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from faithproxy.clients.vllm import VLLMClient\n",
            "faithproxy.faithcore.correction.machine",
            "may not reference clients",
        ),
        # the tools above the product
        (
            "'''Renders with faithproxy.benchmarks.shapesworld.scenes.'''\n",
            "faithproxy.server.chain.reader",
            "may not reference shapesworld",
        ),
        (
            "def f():\n    import faithproxy.benchmarks.evaluation.run\n",
            "faithproxy.server.app",
            "may not reference benchmarks",
        ),
        ("from faithproxy.testing import upstream\n", "faithproxy.server.app", "may not reference testing"),
        (
            "from faithproxy.benchmarks.standins import judge_server\n",
            "faithproxy.testing.faults",
            "may not reference benchmarks",
        ),
        ("X = 'faithproxy.benchmarks.tinyvlm.serve'\n", "faithproxy.clients.vllm", "may not reference tinyvlm"),
        ("from faithproxy.server.app import create_app\n", "faithproxy.detectors.judge", "may not reference server"),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from faithproxy.cli import main\n",
            "faithproxy.benchmarks.evaluation.cli",
            "may not reference command",
        ),
        ("from server.settings import Settings\n", "faithproxy.cli", "bare top-level import"),
        ("import benchmarks\n", "faithproxy.cli", "bare top-level import"),
        ("from . import base\n", "faithproxy.detectors.judge", "relative import"),
        # what the layers may do
        ("from faithproxy.detectors.base import Detector\n", "faithproxy.server.app", None),
        ("from faithproxy.detectors.registry import DETECTORS\n", "faithproxy.regenerators.reflect", None),
        ("from faithproxy.regenerators.registry import build_regenerator\n", "faithproxy.server.app", None),
        ("from faithproxy.detectors.probe import Probe\n", "faithproxy.detectors.cascade", None),
        ("from faithproxy.faithcore.types import Step\n", "faithproxy.clients.vllm", None),
        ("import numpy as np\nimport nltk\n", "faithproxy.faithcore.correction.machine", None),
        ("from faithproxy.server.app import create_app\n", "faithproxy.testing.upstream", None),
        ("from faithproxy.testing import upstream\n", "faithproxy.benchmarks.tinyvlm.serve", None),
        ("from faithproxy.benchmarks.shapesworld.scenes import render\n", "faithproxy.benchmarks.evaluation.cli", None),
        ("log = 'server.log'\n", "faithproxy.faithcore.types", None),
        ("NAME = 'faithproxy.requests'\n", "faithproxy.faithcore.types", None),  # a logger, not a module
    ],
)
def test_the_rule_itself(source: str, module: str, expected: str | None) -> None:
    """The checker catches each kind of forbidden reference and lets the allowed ones through."""
    problems = violations(references(ast.parse(source), product_files()), "planted.py", module)
    if expected is None:
        assert problems == []
    else:
        assert len(problems) == 1 and expected in problems[0], problems


# ---- the rooms of server/ (server/__init__.py draws them) ----
# Bottom to top: a server module references only its own room and the rooms before it, so no import runs
# back up and none goes round in a circle. A top-level module (settings, state, app, cli) is a room alone.
ROOMS = ("settings", "protocol", "observe", "admission", "runtime", "chain", "state", "doors", "shadow", "app", "cli")
MAX_TOP_LEVEL_MODULES = 12


def room_of(module: str) -> str | None:
    """The room of a faithproxy.server module, "" for the package itself, None outside the server."""
    parts = module.split(".")
    if parts[:2] != ["faithproxy", "server"]:
        return None
    return parts[2] if len(parts) > 2 else ""


def room_violations(refs: Iterable[Reference], rel: str, module: str) -> list[str]:
    """The references in `refs` that run from `module`'s room up to a later one."""
    own = room_of(module)
    if not own:
        return []
    known = product_files()
    problems = []
    for line, name in refs:
        other = room_of(_target(name, known))
        if other is None or other == "" or other == own:
            continue
        if other not in ROOMS or own not in ROOMS:
            problems.append(f"{rel}:{line}: {name!r}: {other if other not in ROOMS else own!r} is not a room of ROOMS")
        elif ROOMS.index(other) > ROOMS.index(own):
            problems.append(f"{rel}:{line}: {name!r}: {own}/ may not reference {other}/, a later room")
    return problems


def test_server_rooms_reference_only_earlier_rooms() -> None:
    server = {name: path for name, path in product_files().items() if room_of(name) is not None}
    problems = [
        problem
        for name, path in server.items()
        for problem in room_violations(file_references(path), str(path.relative_to(REPO)), name)
    ]
    assert not problems, "\n".join(problems)


def test_server_top_level_is_its_rooms() -> None:
    """Every folder and module at server/'s top is a room of ROOMS, and there are at most a dozen."""
    top = sorted(p.stem for p in (REPO / "server").iterdir() if p.suffix == ".py" and p.stem != "__init__")
    folders = sorted(p.name for p in (REPO / "server").iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert set(top) | set(folders) == set(ROOMS), (top, folders)
    assert len(top) + len(folders) <= MAX_TOP_LEVEL_MODULES


@pytest.mark.parametrize("room", [room for room in ROOMS if (REPO / "server" / room).is_dir()])
def test_each_room_says_what_it_may_import(room: str) -> None:
    """A room's docstring names the rooms it may import, and they are exactly the earlier ones: the
    docstring a newcomer reads and the rule this test enforces can't drift apart."""
    doc = ast.get_docstring(_parse(REPO / "server" / room / "__init__.py")) or ""
    match = re.search(r"May import:\s*([^.(]*)", doc)
    assert match, f"server/{room}/__init__.py: its docstring should end with 'May import: <rooms>.'"
    named = {word.strip() for word in match.group(1).replace("\n", " ").split(",")}
    assert named == set(ROOMS[: ROOMS.index(room)]), named


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The product modules a file imports (anywhere), strings left out: a registry names its plug-ins'
    modules as lazy entries on purpose, and a string is not loaded when the registry is."""
    tree = _parse(path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= set(_from_import(node, known))
    return {_target(name, known) for name in names} & known.keys()


def test_no_import_circles_in_the_product() -> None:
    """No two product modules import each other, however indirectly (TYPE_CHECKING and function-level
    imports included: a cycle hidden in a function is still a cycle)."""
    known = product_files()
    graph = {name: _imports(path, known) - {name} for name, path in known.items() if layer_of(name) in PRODUCT}
    assert _cycles(graph) == []


def test_the_room_rule_itself() -> None:
    known = product_files()
    planted = references(ast.parse("from faithproxy.server.doors.serving import DoorServing\n"), known)
    assert room_violations(planted, "x.py", "faithproxy.server.observe.traces")
    assert not room_violations(planted, "x.py", "faithproxy.server.doors.off")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
