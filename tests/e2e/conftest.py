"""Fixtures for end-to-end tests: a real local control plane (or ROOFTOP_KUBECONFIG) and
a real Prometheus.

Missing binaries: in CI (env CI set) they are built with tests/cluster/build-bins.sh and a
failure FAILS the test, so CI can never go green by skipping. Locally the tests skip with
a hint to run `make tools` (set ROOFTOP_BUILD_TOOLS=1 to build from here instead).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.controlplane import (
    REQUIRED,
    TOOLS,
    ControlPlane,
    default_bin_dir,
    missing_binaries,
)
from tests.cluster.handle import ClusterHandle
from tests.cluster.prometheus import PrometheusServer, find_prometheus
from tests.cluster.vllm_engines import ENGINE_DIR, tiny_model, vllm_python

CLUSTER_DIR = Path(__file__).resolve().parents[1] / "cluster"


def _unavailable(msg: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{msg} (CI: e2e tests may not skip)", pytrace=False)
    pytest.skip(f"{msg}; run `make tools`")


def _run_script(script: str, log: Path, where: Path = CLUSTER_DIR) -> str | None:
    """Run a script (tests/cluster's by default); its stdout's last line (a path) or None
    on failure."""
    with log.open("w") as err:
        result = subprocess.run(
            [str(where / script)], stdout=subprocess.PIPE, stderr=err, text=True
        )
    if result.returncode != 0:
        return None
    return result.stdout.strip().splitlines()[-1]


def _ensure_binaries(names: tuple[str, ...], log: Path) -> Path:
    bin_dir = default_bin_dir()
    if not missing_binaries(bin_dir, names):
        return bin_dir
    built = ""
    if os.environ.get("CI") or os.environ.get("ROOFTOP_BUILD_TOOLS"):
        _run_script("build-bins.sh", log)  # cached: only builds what is missing
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        built = f"\nbuild-bins.sh log ({log}):\n{tail}"
    missing = missing_binaries(bin_dir, names)
    if missing:
        _unavailable(f"control-plane binaries missing from {bin_dir}: {missing}{built}")
    return bin_dir


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    """The cluster for this test session: ROOFTOP_KUBECONFIG if set, else a fresh local
    control plane with fake GPU nodes (2x8 H100, 2x8 A100, 4x1 L4, 1 CPU node)."""
    work = tmp_path_factory.mktemp("cluster")
    byo = os.environ.get("ROOFTOP_KUBECONFIG")
    if byo:
        yield ClusterHandle(Path(byo).resolve(), default_bin_dir(), work)
        return
    bin_dir = _ensure_binaries(REQUIRED + TOOLS, work / "build-bins.log")
    cp = ControlPlane(state_dir=work / "controlplane", bin_dir=bin_dir, die_with_parent=True)
    cp.start()
    try:
        yield ClusterHandle(cp.kubeconfig, bin_dir, work)
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def prometheus_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a working Prometheus binary (fetched from Debian's package if needed)."""
    found = find_prometheus()
    if found is None:
        log = tmp_path_factory.mktemp("prometheus-fetch") / "fetch.log"
        fetched = _run_script("fetch-prometheus.sh", log)
        found = Path(fetched) if fetched else None
    if found is None:
        _unavailable("prometheus binary missing (tests/cluster/fetch-prometheus.sh failed)")
    assert found is not None
    return found


@pytest.fixture
def prometheus(tmp_path: Path, prometheus_bin: Path) -> Iterator[PrometheusServer]:
    """A started Prometheus (1 s scrapes) with no targets; use set_targets()/query()."""
    server = PrometheusServer(tmp_path / "prometheus", prometheus_bin).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_py(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of the real vLLM's venv (tests/engine/install-vllm.sh; CI installs it
    here if `make tools` did not)."""
    found = vllm_python()
    if found is None and (os.environ.get("CI") or os.environ.get("ROOFTOP_BUILD_TOOLS")):
        log = tmp_path_factory.mktemp("vllm-install") / "install.log"
        installed = _run_script("install-vllm.sh", log, ENGINE_DIR)
        found = Path(installed) if installed else None
    if found is None:
        _unavailable("the real vLLM is not installed (tests/engine/install-vllm.sh)")
    assert found is not None
    return found


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_py: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama checkpoint the real vLLM serves (tests/engine/tiny_model.py)."""
    return tiny_model(vllm_py, tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def prometheus_operator_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Prometheus Operator built from its Go module, with its CRDs
    (tests/cluster/build-prometheus-operator.sh, cached)."""
    log = tmp_path_factory.mktemp("prometheus-operator-build") / "build.log"
    built = _run_script("build-prometheus-operator.sh", log)
    if built is None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        _unavailable(f"the Prometheus Operator did not build ({log}):\n{tail}")
    assert built is not None
    return Path(built)
