"""What the wheel (and so the operator image) carries: every data file the packages
read at run time must be declared package data, or it works from a checkout and fails
installed (`pip install .`, the container image)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = {"rooftop_planner": ROOT / "planner", "rooftop_operator": ROOT / "operator"}


def declared() -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data: dict[str, list[str]] = config["package-data"]
    return data


def shipped(path: Path, package_data: dict[str, list[str]]) -> bool:
    """Whether a file under a package dir matches a package-data glob of its package
    (setuptools globs are relative to the package's own directory)."""
    parts = path.parts
    for package, patterns in package_data.items():
        pkg_parts = tuple(package.split("."))
        if parts[: len(pkg_parts)] == pkg_parts:
            rel = "/".join(parts[len(pkg_parts) :])
            # like setuptools, a glob does not reach into subdirectories
            if any(rel.count("/") == p.count("/") and fnmatch.fnmatch(rel, p) for p in patterns):
                return True
    return False


def test_every_non_python_file_in_the_packages_is_package_data() -> None:
    package_data = declared()
    missing = []
    for top, base in PACKAGE_DIRS.items():
        for path in (base / top).rglob("*"):
            if path.is_file() and path.suffix not in (".py", ".pyc"):
                rel = path.relative_to(base)
                if not shipped(rel, package_data):
                    missing.append(str(rel))
    assert not missing, f"add to [tool.setuptools.package-data]: {missing}"


def test_the_catalogs_are_among_them() -> None:
    # guards the check itself: these are read by every `rooftop plan`
    package_data = declared()
    for name in ("gpus.yaml", "models.yaml", "efficiency.yaml"):
        assert shipped(Path("rooftop_planner/catalog") / name, package_data)
    assert not shipped(Path("rooftop_planner/catalog/notes.txt"), package_data)
    assert not shipped(Path("rooftop_planner/catalog/old/gpus.yaml"), package_data)


def test_the_license_file_ships_with_the_metadata() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    for name in project["license-files"]:
        assert "Apache License" in (ROOT / name).read_text()
