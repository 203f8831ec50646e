"""Print pip pins of the lowest versions pyproject.toml declares for the libraries whose
APIs the operator leans on most, so a CI step can install exactly those and run the
operator's tests against them: a floor nothing tests is a guess.

Usage: python tests/floors/floors.py  ->  pydantic==2.13.5 kopf==1.44.6 kubernetes==37.0.0
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("kubernetes", "kopf", "pydantic")


def floors(dependencies: list[str]) -> dict[str, str]:
    """{name: lowest version} for the CHECKED names, from ``name>=X[,<Y]`` entries.

    Raises:
        ValueError: a CHECKED library without a ``>=`` floor.
    """
    found: dict[str, str] = {}
    for dep in dependencies:
        match = re.match(r"^([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", dep)
        if match and match.group(1).lower() in CHECKED:
            found[match.group(1).lower()] = match.group(2)
    missing = [name for name in CHECKED if name not in found]
    if missing:
        raise ValueError(f"pyproject.toml: no '>=' floor for {', '.join(missing)}")
    return found


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = floors(project["dependencies"])
    print(" ".join(f"{name}=={version}" for name, version in pins.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
