"""`pip install faithproxy` is the proxy; the tools' libraries come with extras (pyproject.toml).

Three promises are checked here: the server runs with none of the extras' libraries (every server
module, every registered detector and regenerator, the app and its lifespan import and start with them
blocked, and none of benchmarks/, benchmarks/shapesworld/, benchmarks/tinyvlm/, testing/ gets loaded); each folder's
third-party imports are covered by the base dependencies and the extras meant for it; and a command whose
extra is missing says which extra to install (faithproxy/cli.py's EXTRAS, kept equal to pyproject.toml).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from faithproxy import cli

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# Distributions whose import name is not their own name, or that provide several top-level modules.
PROVIDES = {
    "pillow": {"PIL"},
    "pyyaml": {"yaml"},
    "fastapi": {"fastapi", "starlette"},  # the server uses starlette's types directly; fastapi pins it
    "pydantic-settings": {"pydantic_settings"},
    "prometheus-client": {"prometheus_client"},
    "opentelemetry-sdk": {"opentelemetry"},
    "opentelemetry-exporter-otlp": {"opentelemetry"},
}
TOOLS = ("benchmarks", "testing", "flywheel")  # the lab (ShapesWorld and tinyvlm inside), the fake, the exporter


def _modules(requirements: list[str]) -> set[str]:
    """The top-level modules a list of requirement strings installs."""
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements}  # type: ignore[union-attr]
    return set().union(*(PROVIDES.get(name, {name.replace("-", "_")}) for name in names))


BASE = _modules(PROJECT["dependencies"])
EXTRA_MODULES = {name: _modules(reqs) for name, reqs in PROJECT["optional-dependencies"].items()}
# Every library an extra brings that the base does not: none of them may load with the server.
BLOCKED = sorted(set().union(*(m for name, m in EXTRA_MODULES.items() if name != "dev")) - BASE)

_SERVER_WITHOUT_EXTRAS = """
import asyncio, importlib, json, pkgutil, sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import name` now fails as if the extra were not installed
import faithproxy.server
for info in pkgutil.walk_packages(faithproxy.server.__path__, "faithproxy.server."):
    importlib.import_module(info.name)
from faithproxy.detectors.registry import DETECTORS
from faithproxy.regenerators.registry import REGENERATORS
for registry in (DETECTORS, REGENERATORS):
    for name in registry:
        registry.resolve(name)
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings

async def start_and_stop(app):
    async with app.router.lifespan_context(app):
        pass

asyncio.run(start_and_stop(create_app(Settings(upstream_url="http://vllm.test"))))
print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None)))
"""


def test_the_server_needs_no_extra_and_loads_no_tool() -> None:
    script = _SERVER_WITHOUT_EXTRAS.format(blocked=BLOCKED)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.splitlines()[-1])
    tools = [m for m in loaded if m.split(".")[:2] in (["faithproxy", t] for t in TOOLS)]
    assert tools == [], f"the server loaded tool code: {tools}"
    assert not set(BLOCKED) & {m.split(".")[0] for m in loaded}


def test_the_blocked_libraries_are_the_tools_libraries() -> None:
    """What the server test blocks is real: numpy, PIL, matplotlib, torch... are extras, not the base."""
    assert {"numpy", "PIL", "matplotlib", "tqdm", "pyarrow", "torch", "transformers", "safetensors"} <= set(BLOCKED)


# Third-party imports no extra lists, each with the reason it needs none.
UNLISTED = {
    "vllm": "clients/hidden_states_connector.py runs inside vLLM (scripts/install_vllm.sh installs it)",
    "torch": "as vllm: the connector is loaded by vLLM, which brings torch",
    "psutil": "benchmarks/performance/overhead_client.py reads /proc when psutil is absent",
}
# The extras each folder is written against (besides the base dependencies).
FOLDER_EXTRAS = {
    "faithcore": (),
    "clients": ("probe",),
    "detectors": ("probe",),
    "regenerators": (),
    "server": (),
    "faithproxy": (),
    "benchmarks": ("bench", "train"),  # the lab: the ShapesWorld bench drives the models it trains
    "benchmarks/shapesworld": ("train",),
    "benchmarks/tinyvlm": ("train",),
    "flywheel": ("train",),
}


def _third_party(folder: str) -> dict[str, str]:
    """Top-level third-party module -> a file of `folder` that imports it."""
    found: dict[str, str] = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names} - set(sys.stdlib_module_names) - {"faithproxy"}:
                found.setdefault(top, str(path.relative_to(REPO)))
    return found


@pytest.mark.parametrize("folder", list(FOLDER_EXTRAS))
def test_each_folders_libraries_come_with_the_base_or_its_extras(folder: str) -> None:
    allowed = BASE.union(*(EXTRA_MODULES[extra] for extra in FOLDER_EXTRAS[folder]), UNLISTED)
    missing = {module: path for module, path in _third_party(folder).items() if module not in allowed}
    assert missing == {}, f"{folder}/ imports libraries that neither the base nor {FOLDER_EXTRAS[folder]} install"


def test_the_commands_table_of_extras_is_pyprojects() -> None:
    assert {name: set(modules) for name, modules in cli.EXTRAS.items()} == {
        name: modules for name, modules in EXTRA_MODULES.items() if name != "dev"
    }
    assert set(cli.COMMAND_EXTRA.values()) <= set(cli.EXTRAS)
    commands = set(cli.build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert set(cli.COMMAND_EXTRA) <= commands


@pytest.mark.parametrize(
    ("command", "module", "extra"),
    [
        ("bench", "matplotlib", "bench"),
        ("bench", "numpy", "bench"),
        ("bench", "torch", "train"),  # the ShapesWorld bench loads the trained models
        ("demo", "numpy", "train"),
        ("demo", "PIL", "train"),
        ("serve", "safetensors", "probe"),
        ("probe", "numpy", "bench"),
        ("bench", "fastapi", None),  # a base dependency: a broken install, not a missing extra
        ("bench", "faithproxy", None),
    ],
)
def test_the_extra_named_for_a_missing_module(command: str, module: str, extra: str | None) -> None:
    assert cli.extra_for(command, module) == extra


def test_a_command_without_its_extra_says_which_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`faithproxy probe` imports numpy first thing; without it the command names the extra, exit 2."""
    monkeypatch.setitem(sys.modules, "numpy", None)
    monkeypatch.delitem(sys.modules, "faithproxy.benchmarks.probes.probe_cli", raising=False)
    assert cli.main(["probe", "--help"]) == cli.MISSING_EXTRA
    err = capsys.readouterr().err
    assert "faithproxy probe needs the 'bench' extra" in err and "pip install 'faithproxy[bench]'" in err


def test_a_missing_module_of_faithproxy_itself_is_not_explained_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "faithproxy.benchmarks.probes.probe_cli", None)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["probe", "--help"])
