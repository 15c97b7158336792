"""The install puts one name, `faithproxy`, at the top of site-packages, and holds every package.

The repo keeps a folder per layer (server/, detectors/, ...); pyproject.toml maps each under the
`faithproxy` namespace with setuptools' package-dir. These tests keep that mapping whole: the package list
names every folder that holds Python code, and a wheel built from the tree imports on its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def test_every_folder_with_code_is_a_listed_package() -> None:
    config = _config()
    folders = {name: Path(path) for name, path in config["package-dir"].items()}
    expected = set()
    stray = []
    for name, folder in folders.items():
        for directory in [REPO / folder, *(p for p in (REPO / folder).rglob("*") if p.is_dir())]:
            if "__pycache__" in directory.parts or not any(directory.glob("*.py")):
                continue
            if not (directory / "__init__.py").exists():
                stray.append(str(directory.relative_to(REPO)))
                continue
            expected.add(".".join([name, *directory.relative_to(REPO / folder).parts]))
    assert stray == [], f"folders with Python files but no __init__.py (they would not install): {stray}"
    assert sorted(config["packages"]) == sorted(expected)


def test_nothing_generic_at_the_top() -> None:
    config = _config()
    assert {name.split(".")[0] for name in config["packages"]} == {"faithproxy"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the venv's setuptools builds it, so no index is needed.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )
    (path,) = out.glob("faithproxy-*.whl")
    return path


def test_wheel_has_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"faithproxy", next(t for t in tops if t.endswith(".dist-info"))}
    assert "faithproxy/server/app.py" in names and "faithproxy/benchmarks/standins/judge_server.py" in names
    assert "faithproxy/testing/__init__.py" in names, "the public fake upstream ships for users' tests"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "faithproxy = faithproxy.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_wheel_requires_the_servers_libraries_and_offers_the_rest_as_extras(wheel: Path) -> None:
    """`pip install faithproxy` pulls what the server imports; numpy, torch, matplotlib... only with an extra."""
    archive = zipfile.ZipFile(wheel)
    metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    unconditional = {r.split(";")[0].split(">")[0].split("=")[0].strip() for r in requires if "extra ==" not in r}
    assert {"fastapi", "uvicorn", "httpx"} <= unconditional
    assert not unconditional & {"numpy", "pillow", "matplotlib", "tqdm", "pyarrow", "torch", "transformers"}
    extras = {line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Provides-Extra:")}
    assert extras == {"probe", "bench", "train", "dev"}


def test_wheel_imports_on_its_own(wheel: Path, tmp_path: Path) -> None:
    """Unpacked away from the repo, the wheel's own files serve `faithproxy.*` (nothing from the tree)."""
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    probe = (
        "import faithproxy.server.app, faithproxy.cli, faithproxy.detectors.registry as r; "
        "print(faithproxy.server.app.__file__); print(faithproxy.cli.__file__); print(r.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    files = result.stdout.split()
    assert len(files) == 3 and all(f.startswith(str(tmp_path / "site")) for f in files), files
