"""The import rule of the house: every module imports only its own layer or the ones below it.

    faithcore → clients → detectors → regenerators → server      (the product, bottom to top)
    tinyvlm → shapesworld → benchmarks                             (fixtures and measurement, above it)
    faithproxy (cli.py, demo.py)                                   (the top: assembles the command)

A reference counts whether it is an import statement (anywhere: inside functions and TYPE_CHECKING
blocks too) or a string naming a module (`"faithproxy.benchmarks.standins.judge_server"` handed to
`python -m`, a lazy registry entry "faithproxy.detectors.judge:JudgeDetector", a docstring that tells
the reader to run one). Bare top-level names (`import server`) are refused everywhere: they import the
repo's folders as unrelated packages, beside the installed `faithproxy.server`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Rank of each folder: a module may reference its own rank or lower ones.
RANKS = {
    "faithcore": 0,
    "clients": 1,
    "detectors": 2,
    "regenerators": 3,
    "server": 4,
    "tinyvlm": 5,
    "shapesworld": 6,
    "benchmarks": 7,
    "faithproxy": 8,
}
FOLDERS = [name for name in RANKS if name != "faithproxy"]
_MODULE_IN_TEXT = re.compile(r"(?<![\w.])faithproxy\.({})\b".format("|".join(FOLDERS)))
_BARE = re.compile(r"^({})(\.|$)".format("|".join(FOLDERS)))


def _rank_of_reference(dotted: str) -> int | None:
    """The rank a `faithproxy....` module path points into, None for anything else."""
    parts = dotted.split(".")
    if parts[0] != "faithproxy":
        return None
    if len(parts) == 1 or parts[1] not in RANKS:
        return RANKS["faithproxy"]  # faithproxy.cli, faithproxy.demo, the package itself
    return RANKS[parts[1]]


def references(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every module this source imports or names in a string."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((node.lineno, "." * node.level + (node.module or "")))
            elif node.module:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in _MODULE_IN_TEXT.finditer(node.value):
                found.append((node.lineno, f"faithproxy.{match.group(1)}"))
    return found


def _python_files(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def violations(source: str, rel: str, own_rank: int) -> list[str]:
    """What in `source` (shown as `rel`) breaks the rule for a module of rank `own_rank`."""
    problems = []
    for line, name in references(source):
        if name.startswith("."):
            problems.append(f"{rel}:{line}: relative import {name!r} (write the faithproxy.… path)")
        elif _BARE.match(name):
            problems.append(f"{rel}:{line}: bare top-level import {name!r} (write faithproxy.{name})")
        else:
            rank = _rank_of_reference(name)
            if rank is not None and rank > own_rank:
                problems.append(f"{rel}:{line}: {name!r} is above this layer")
    return problems


@pytest.mark.parametrize("folder", list(RANKS))
def test_no_module_reaches_above_its_layer(folder: str) -> None:
    files = _python_files(folder)
    assert files, f"no Python files under {folder}/"
    problems = [p for path in files for p in violations(_read(path), _rel(path), RANKS[folder])]
    assert not problems, "\n".join(problems)


def test_tests_and_scripts_use_the_namespace() -> None:
    """Tests, deploy files and scripts may import any layer, but only through `faithproxy.`."""
    files = _python_files("tests") + _python_files("deploy") + _python_files("scripts")
    problems = [p for path in files for p in violations(_read(path), _rel(path), RANKS["faithproxy"])]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "rank", "expected"),
    [
        ("from faithproxy.server.app import create_app\n", RANKS["detectors"], "above this layer"),
        ("def f():\n    import faithproxy.benchmarks.evaluation.run\n", RANKS["server"], "above this layer"),
        ("X = 'faithproxy.tinyvlm.serve'\n", RANKS["clients"], "above this layer"),
        ("'''Run python -m faithproxy.shapesworld.model.train.'''\n", RANKS["server"], "above this layer"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from faithproxy.cli import main\n",
         RANKS["benchmarks"], "above this layer"),  # fmt: skip
        ("from server.settings import Settings\n", RANKS["faithproxy"], "bare top-level import"),
        ("import benchmarks\n", RANKS["faithproxy"], "bare top-level import"),
        ("from . import base\n", RANKS["detectors"], "relative import"),
        ("from faithproxy.faithcore.types import Step\n", RANKS["clients"], None),
        ("from faithproxy.detectors.base import Detector\n", RANKS["detectors"], None),
        ("log = 'server.log'\n", RANKS["faithcore"], None),
    ],
)
def test_the_rule_itself(source: str, rank: int, expected: str | None) -> None:
    """The checker catches each kind of upward reference and lets downward ones through."""
    problems = violations(source, "probe.py", rank)
    if expected is None:
        assert problems == []
    else:
        assert len(problems) == 1 and expected in problems[0], problems
