"""The Containerfile agrees with the chart and the package it installs.

No container engine runs here, so the image is not built in CI; these checks keep the
file from drifting from what the chart runs (command, user) and what the wheel needs
(the Python version, the files its build reads)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = (ROOT / "Containerfile").read_text()
VALUES = yaml.safe_load((ROOT / "charts" / "rooftop" / "values.yaml").read_text())
DEPLOYMENT = (ROOT / "charts" / "rooftop" / "templates" / "deployment.yaml").read_text()


def instructions(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", CONTAINERFILE, flags=re.MULTILINE)


def test_the_image_runs_as_the_charts_user() -> None:
    ctx = VALUES["podSecurityContext"]
    assert instructions("USER") == [f"{ctx['runAsUser']}:{ctx['runAsGroup']}"]


def test_the_charts_command_is_on_the_path() -> None:
    assert 'command: ["rooftop"]' in DEPLOYMENT
    assert instructions("ENTRYPOINT") == ['["rooftop"]']
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "rooftop" in scripts


def test_the_base_image_python_meets_requires_python() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = tuple(int(x) for x in project["requires-python"].removeprefix(">=").split("."))
    for base in instructions("FROM"):
        version = re.match(r"python:(\d+)\.(\d+)", base)
        assert version, base
        assert tuple(int(x) for x in version.groups()) >= minimum


def test_the_build_copies_what_the_wheel_needs_and_dockerignore_lets_it_in() -> None:
    copied = [p for line in instructions("COPY") if "--from" not in line
              for p in line.split()[:-1]]  # fmt: skip
    assert set(copied) >= {"pyproject.toml", "README.md", "LICENSE", "planner", "operator"}
    for path in copied:
        assert (ROOT / path).exists(), path
    allowed = (ROOT / ".dockerignore").read_text()
    for path in copied:
        assert f"!{path}" in allowed, f".dockerignore keeps {path} out of the build context"
