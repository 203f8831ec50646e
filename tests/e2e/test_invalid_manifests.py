"""Invalid ServingTargets are rejected by the API server itself (CRD schema + CEL), with
an error that names the offending field, before the operator ever sees them.

Each file in manifests/invalid/ starts with `# expect: <field path>`; the same files are
checked against the pydantic models in tests/unit/operator/test_operator_crd.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.handle import ClusterHandle, wait_until

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
CRD = HERE.parents[1] / "charts" / "rooftop" / "crds" / "servingtargets.rooftop.dev.yaml"
INVALID = sorted((HERE / "manifests" / "invalid").glob("*.yaml"))


def expected_field(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path.name
    return first.removeprefix("# expect: ").strip()


@pytest.fixture(scope="module")
def namespace(cluster: ClusterHandle) -> Iterator[str]:
    """The CRD installed (idempotently: the operator tests' Helm release may have done
    it already) and a namespace to dry-run into."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/servingtargets.rooftop.dev")  # fmt: skip
    name = f"invalid-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def dry_run(cluster: ClusterHandle, namespace: str, path: Path) -> tuple[int, str]:
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False
    )
    return result.returncode, result.stdout + result.stderr


def test_there_are_at_least_15(namespace: str) -> None:
    assert len(INVALID) >= 15


def test_the_baseline_is_accepted(cluster: ClusterHandle, namespace: str) -> None:
    # Discovery of a just-established CRD can lag a moment behind the condition.
    def accepted() -> bool:
        return dry_run(cluster, namespace, HERE / "manifests" / "valid.yaml")[0] == 0

    wait_until(accepted, 30, "the valid baseline manifest to be accepted")


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_rejected_naming_the_field(cluster: ClusterHandle, namespace: str, path: Path) -> None:
    code, output = dry_run(cluster, namespace, path)
    assert code != 0, f"{path.name} was accepted"
    assert expected_field(path) in output, output
