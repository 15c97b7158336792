"""No function of the product has more than 15 branches, except the parsers and scanners that
docs/ARCHITECTURE.md names (a reader of one of those follows a grammar, not a decision tree).

Branches are counted by ruff's mccabe rule (C901: cyclomatic complexity); a named exception carries
`# noqa: C901` on its `def` line, and every such line must be in the page's list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ["faithcore", "clients", "detectors", "regenerators", "server"]
MAX_BRANCHES = 15
_EXEMPT_DEF = re.compile(r"^\s*(?:async )?def (\w+)\(.*#\s*noqa: C901", re.MULTILINE)


def test_no_product_function_has_more_than_15_branches() -> None:
    command = [sys.executable, "-m", "ruff", "check", "--select", "C901", "--output-format", "concise"]
    command += ["--config", f"lint.mccabe.max-complexity={MAX_BRANCHES}", *PRODUCT]
    found = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    assert found.returncode == 0, found.stdout + found.stderr


def test_every_exempt_function_is_named_in_the_architecture_page() -> None:
    page = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    exempt = {
        f"{path.relative_to(REPO)}:{name}"
        for folder in PRODUCT
        for path in (REPO / folder).rglob("*.py")
        for name in _EXEMPT_DEF.findall(path.read_text(encoding="utf-8"))
    }
    missing = sorted(e for e in exempt if f"`{e.split(':')[1]}` ({e.split(':')[0]})" not in page)
    assert not missing, f"exempt from the branch limit but not named in docs/ARCHITECTURE.md: {missing}"
