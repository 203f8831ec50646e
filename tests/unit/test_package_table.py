"""docs/development.md's package table names every module: a newcomer finds a module's
home from it, so a module added without a line there fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(
    path.parent
    for root in ("planner", "operator")
    for path in (ROOT / root).glob("rooftop_*/__init__.py")
)


def _row(package: Path) -> str:
    """The package table's row for ``package`` (its first cell names the folder)."""
    folder = f"`{package.relative_to(ROOT)}/`"
    text = (ROOT / "docs" / "development.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith(f"| {folder} |")]
    assert rows, f"docs/development.md: add a package table row for {folder}"
    return rows[0]


def _modules(package: Path) -> list[str]:
    """What the row must name: each module (``name.py``) and subpackage (``name/``)."""
    modules = [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
    subpackages = [f"{p.parent.name}/" for p in package.glob("*/__init__.py")]
    return sorted(modules + subpackages)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_the_package_table_names_every_module(package: Path) -> None:
    row = _row(package)
    named = set(re.findall(r"`([\w/]+(?:\.py|/))`", row))
    missing = [m for m in _modules(package) if m not in named and f"`{m}`" not in row]
    assert not missing, f"docs/development.md, the {package.name} row: say what {missing} hold"


def test_every_package_is_found() -> None:
    assert len(PACKAGES) == 7
