"""tests/floors/floors.py: the pins `make floors` installs are pyproject.toml's floors."""

from __future__ import annotations

import pytest
from tests.floors.floors import CHECKED, floors


def test_the_floors_are_read_from_the_declared_ranges() -> None:
    deps = ["pydantic>=2.13.5,<3", "kopf>=1.37.0,<2", "kubernetes>=37.0.0", "numpy>=1.26"]
    assert floors(deps) == {"pydantic": "2.13.5", "kopf": "1.37.0", "kubernetes": "37.0.0"}


def test_a_checked_library_without_a_floor_is_an_error() -> None:
    with pytest.raises(ValueError, match="no '>=' floor for kopf"):
        floors(["pydantic>=2.13.5", "kopf", "kubernetes>=37.0.0"])


def test_kubernetes_is_declared_no_older_than_the_client_kube_py_calls() -> None:
    """kube.py calls ApiClient.param_serialize, first shipped in kubernetes 37.0.0: with
    the old floor (29.0) every apply failed on a resolver that picked it."""
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    declared = floors(tomllib.loads(pyproject.read_text())["project"]["dependencies"])
    assert set(declared) == set(CHECKED)
    assert tuple(int(p) for p in declared["kubernetes"].split(".")[:1]) >= (37,)
