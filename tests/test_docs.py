"""The documentation stays true to the code it describes.

The README is a front door for users (short enough to read), and every page under docs/, the ShapesWorld
record and the deploy guide name modules, files, commands, settings, headers and metrics that move as the
code moves. These tests read the pages and check each such name against the tree, so a rename that
forgets a page fails here instead of misleading a reader.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [
    README,
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "benchmarks" / "shapesworld" / "README.md",
    REPO / "deploy" / "README.md",
]
# The team's limit for the front page (a longer one is a sign that reference material crept back in).
README_MAX_LINES = 400

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_SHELL_FENCE = re.compile(r"^```(?:bash|sh|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")
_MODULE = re.compile(r"(?<![\w/.-])faithproxy(?:\.[A-Za-z_]\w*)+")
_COMMAND = re.compile(r"(?<![\w./$-])faithproxy ([a-z][\w-]*)(?: ([a-z][\w-]*))?")
_PATH = re.compile(r"^(?:\.\./)?[\w.-]+(?:/[\w.*-]+)+/?$")


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _prose(page: Path) -> str:
    """The page without its fenced blocks (commands there may name files they create or delete)."""
    return _FENCE.sub("", _text(page))


def _commands(page: Path) -> list[str]:
    """Where the pages write commands: bash and python blocks without their comments, and inline code
    that starts with one (a layout drawing or a prose mention of the proxy is not a command)."""
    text = _text(page)
    blocks = [re.sub(r"#.*", "", block) for block in _SHELL_FENCE.findall(text)]
    spans = [span for span in _CODE_SPAN.findall(_FENCE.sub("", text)) if span.startswith("faithproxy ")]
    return [*blocks, *spans]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in _prose(page).splitlines() if line.startswith("#")}


def _defines(path: Path, name: str) -> bool:
    """Whether the module file defines `name` at its top level (read, not imported)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def test_the_readme_is_short() -> None:
    lines = _text(README).count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference material to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_module_named_exists(page: Path) -> None:
    missing = []
    for dotted in sorted(set(_MODULE.findall(_text(page)))):
        parts = dotted.split(".")
        # The longest prefix that is a module; what follows it must be one name defined there.
        for cut in range(len(parts), 1, -1):
            try:
                spec = importlib.util.find_spec(".".join(parts[:cut]))
            except ModuleNotFoundError:
                spec = None
            if spec is not None:
                break
        rest = parts[cut:] if spec is not None else parts
        if spec is None or len(rest) > 1 or (rest and not _defines(Path(spec.origin), rest[0])):
            missing.append(dotted)
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_file_named_exists(page: Path) -> None:
    """Paths in inline code, from the repository root or from the page's folder; var/ (ignored by git),
    ~/ and absolute paths are what commands write, not what the repo holds."""
    missing = []
    for span in _CODE_SPAN.findall(_prose(page)):
        for token in span.split():
            token = token.strip("(),;:")
            if not _PATH.match(token) or token.startswith("var/"):
                continue
            bases = [
                base for base in (REPO, page.parent) if (base / token.split("/")[0]).is_dir() or token.startswith("../")
            ]
            if not bases:
                continue  # var/..., OUT/..., a path inside a container: not a file of this repo
            if not any(list(base.glob(token.rstrip("/"))) for base in bases):
                missing.append(token)
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(page)):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_named_exists(page: Path) -> None:
    from faithproxy.benchmarks.evaluation.cli import COMMANDS
    from faithproxy.cli import build_parser

    subcommands = next(a for a in build_parser()._actions if a.dest == "command").choices
    unknown = []
    for code in _commands(page):
        for command, sub in _COMMAND.findall(code):
            if command not in subcommands:
                unknown.append(f"faithproxy {command}")
            elif command == "bench" and sub and sub not in COMMANDS:
                unknown.append(f"faithproxy bench {sub}")
    assert unknown == []


def test_the_readme_names_every_setting() -> None:
    from faithproxy.server.settings import Settings

    text = _text(README)
    unnamed = [name for name in Settings.model_fields if name.upper() not in text]
    assert unnamed == []


def test_the_readme_names_every_header() -> None:
    from faithproxy.server.admission import policy

    text = _text(README).lower()
    headers = [value for name, value in vars(policy).items() if name.startswith("HEADER_")]
    assert headers, "server/admission/policy.py names its headers HEADER_*"
    headers += policy.detector_headers()  # the detectors' own, declared on their classes
    assert [header for header in headers if header not in text] == []


def test_the_readme_names_every_metric() -> None:
    from faithproxy.server.observe.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    # prometheus_client names a counter's family without the `_total` its samples (and queries) carry.
    names = [m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()]
    assert names
    text = _text(README)
    assert [name for name in names if name not in text] == []


# ---- the architecture page: every code name it cites is defined in the tree ----------------------

ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
_CODE_NAME = re.compile(r"^(?:[A-Z_][A-Z0-9_]*|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)$")
_NAMED_TREES = ["faithcore", "clients", "detectors", "regenerators", "server", "faithproxy", "benchmarks"]


def _defined_names() -> tuple[set[str], dict[str, set[str]]]:
    """Top-level names of every module, and each class's attributes and methods (fields included)."""
    top: set[str] = set()
    members: dict[str, set[str]] = {}
    for folder in _NAMED_TREES:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    top.add(node.name)
                elif isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    top |= {t.id for t in targets if isinstance(t, ast.Name)}
                if isinstance(node, ast.ClassDef):
                    own = members.setdefault(node.name, set())
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                            own.add(item.name)
                        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                            own.add(item.target.id)
                        elif isinstance(item, ast.Assign):
                            own |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return top, members


def test_the_architecture_page_cites_only_names_the_code_defines() -> None:
    """`Class`, `Class.member`, `function` and `FAITHPROXY_SETTING` in the page's prose and tables exist:
    a rename that forgets this page fails here."""
    import tomllib

    from faithproxy.server.settings import Settings

    top, members = _defined_names()
    every_member = set().union(*members.values())
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    unknown = []
    for span in set(_CODE_SPAN.findall(_prose(ARCHITECTURE))):
        if "/" in span or span.startswith("faithproxy") or re.fullmatch(r"[\w.-]+\.(py|toml|md|json|yaml)", span):
            continue  # a path or a module: the tests above check those
        if not _CODE_NAME.match(span):
            continue
        if span in extras:
            known = True
        elif span.startswith("FAITHPROXY_"):
            known = span.removeprefix("FAITHPROXY_").lower() in Settings.model_fields
        elif "." in span:
            owner, member = span.split(".")
            known = member in members.get(owner, set()) or (owner in ("detectors", "regenerators", "server"))
        else:
            known = span in top or span in every_member
        if not known:
            unknown.append(span)
    assert sorted(unknown) == []
