"""What the wheel (and so the operator image) carries: every data file the packages
read at run time must be declared package data, or it works from a checkout and fails
installed (`pip install .`, the container image)."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

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
    for name in ("gpus.yaml", "models.yaml", "kernel_curves.json"):
        assert shipped(Path("rooftop_planner/catalog") / name, package_data)
    assert not shipped(Path("rooftop_planner/catalog/notes.txt"), package_data)
    assert not shipped(Path("rooftop_planner/catalog/old/gpus.yaml"), package_data)


def test_the_license_file_ships_with_the_metadata() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    for name in project["license-files"]:
        assert "Apache License" in (ROOT / name).read_text()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout, unpacked into its own folder (what the
    Containerfile's `pip install` puts in the image, minus the dependencies, which
    come from this venv)."""
    work = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             "-w", str(work), str(ROOT)]  # fmt: skip
    subprocess.run(build, check=True, capture_output=True, cwd=work)
    (wheel,) = work.glob("rooftop-*.whl")
    target = work / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    return target


def run_installed(site: Path, *code: str) -> str:
    """Python without this checkout: -S skips the venv's .pth files (the editable
    install's path hook), so only the unpacked wheel and the dependencies are seen,
    from a working directory outside the repository."""
    deps = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{deps}"}
    done = subprocess.run([sys.executable, "-S", "-c", "\n".join(code)], env=env,
                          cwd=site.parent, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_installed_wheel_plans_and_simulates_without_the_checkout(installed: Path) -> None:
    example, trace = ROOT / "examples" / "simulated-chat.yaml", ROOT / "examples" / "traces"
    out = run_installed(
        installed,
        "import rooftop_planner, rooftop_sim.engine.truth as truth",
        f"assert rooftop_planner.__file__.startswith({str(installed)!r}), rooftop_planner.__file__",
        "from rooftop_cli.main import main",
        f"assert main(['plan', {str(example)!r}]) == 0",
        f"main(['simulate', {str(example)!r}, '--trace', "
        f"{str(trace / 'azure_conv_excerpt.csv')!r}, '--json'])",
    )
    # the same plan as from the checkout: the wheel ships the fitted kernel curves
    from rooftop_api.manifest import load_target
    from rooftop_planner.search import plan_target

    plan = plan_target(load_target(example).spec).plan
    assert plan is not None
    assert f"Chosen: {plan.summary}" in out and '"policy": "rooftop"' in out
