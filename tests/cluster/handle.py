"""What tests get from the `cluster` fixture: one object for any cluster, local or BYO.

Why a separate handle: tests must not care whether the cluster is the local control
plane (tests.cluster.controlplane) or one named by ROOFTOP_KUBECONFIG; both only need
a kubeconfig, the kubectl/helm binaries and a way to mint ServiceAccount credentials.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.cluster import kubeconfig as kc
from tests.cluster.controlplane import find_binary

T = TypeVar("T")


class CommandError(RuntimeError):
    """kubectl/helm failed; the message carries the command and its stderr."""

    def __init__(self, result: subprocess.CompletedProcess[str]) -> None:
        self.result = result
        cmd = " ".join(str(a) for a in result.args)
        super().__init__(f"{cmd} -> exit {result.returncode}\n{result.stderr.strip()}")


@dataclass
class ClusterHandle:
    kubeconfig: Path
    bin_dir: Path
    work_dir: Path  # ServiceAccount kubeconfigs and helm's cache/config live here

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raises CommandError on failure if check."""
        return self._run(
            "kubectl", [f"--kubeconfig={self.kubeconfig}", *args], check, stdin, timeout
        )

    def helm(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster with its cache/config kept out of $HOME."""
        return self._run("helm", [f"--kubeconfig={self.kubeconfig}", *args], check, stdin, timeout)

    def api(self) -> Any:
        """A fresh kubernetes.client.ApiClient for the admin kubeconfig (caller closes it)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def serviceaccount_kubeconfig(self, namespace: str, name: str) -> Path:
        """Kubeconfig authenticating as that (existing) ServiceAccount, via TokenRequest."""
        out = self.work_dir / "sa-kubeconfigs"
        return kc.serviceaccount_kubeconfig(self.kubeconfig, namespace, name, out)

    def create_namespace(self, name: str, timeout: float = 30) -> None:
        """Create a namespace and wait for its `default` ServiceAccount: with the
        ServiceAccount admission plugin on, pods are rejected until it exists."""
        self.kubectl("create", "namespace", name)
        wait_until(
            lambda: (
                self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
                == 0
            ),
            timeout,
            f"default ServiceAccount in {name}",
        )

    def delete_later(self, kind: str, *names: str) -> None:
        """Ask the API server to delete these objects (namespaces, nodes, PVs) without
        waiting or failing: a module's teardown, which must not keep the next one waiting."""
        for name in names:
            self.kubectl("delete", kind, name, "--wait=false", check=False)

    def _run(
        self, tool: str, args: list[str], check: bool, stdin: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        binary = find_binary(tool, self.bin_dir)
        if binary is None:
            raise FileNotFoundError(f"{tool} not found in {self.bin_dir} or PATH: make tools")
        result = subprocess.run(
            [str(binary), *args], input=stdin, capture_output=True, text=True,
            timeout=timeout, env=self._env(),
        )  # fmt: skip
        if check and result.returncode != 0:
            raise CommandError(result)
        return result

    def _env(self) -> dict[str, str]:
        helm_home = self.work_dir / "helm"
        return os.environ | {
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }


def wait_until(predicate: Callable[[], T | None | bool], timeout: float, what: str) -> T | bool:
    """Poll predicate (short backoff) until truthy; return its value or raise TimeoutError."""
    deadline, delay = time.monotonic() + timeout, 0.05
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
