"""High availability end to end: two operator replicas with kopf peering, one active.

The chart is installed with ``replicaCount=2`` (namespace scope: a KopfPeering and a Role
in the watched namespace); two operator processes run here under its ServiceAccount, as
in test_operator.py, with the chart's peering flags and the default priority (the
longest-running replica is active). The test checks that only the active one handles a
new ServingTarget, then measures two failovers: ``kill -9`` of the active replica (the
standby waits for the dead one's keep-alive to expire) and SIGTERM (the stopping replica
removes its keep-alive, so the standby resumes at once). Failover is the time from the
signal to the standby's log line saying it reconciled a target created right after it;
the seconds are printed (run with ``-s``) and quoted in docs/operating.md.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.operator_process import Operator

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rooftop"
PEERING = "rooftop"  # the chart's operator.peering.name
LIFETIME_S = 20  # the chart's operator.peering.lifetimeSeconds
TIMEOUT = 60.0
RESUMED = "Resuming operations after the pause"  # kopf, when a replica becomes active
LOOP_RUNNING = "feedback loop: running"  # the operator, when its loop gets a first target


@dataclass
class Replicas:
    cluster: ClusterHandle
    namespace: str
    a: Operator
    b: Operator
    work: Path
    api: Any

    def start(self, operator: Operator) -> None:
        operator.start("--peering", PEERING, "--peering-lifetime", str(LIFETIME_S))

    def create_target(self, name: str) -> None:
        doc = yaml.safe_load((ROOT / "examples" / "simulated-chat.yaml").read_text())
        doc["metadata"]["name"] = name
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", str(path))

    def reconciled(self, operator: Operator, name: str) -> float:
        """Wait until ``operator`` logs reconciling ``name``; the log line's time (epoch s)."""
        line = f"[{self.namespace}/{name}] Handler 'reconcile_target' succeeded"

        def logged() -> float | None:
            for row in operator.log_since_start().splitlines():
                if line in row:
                    return _logged_at(row)
            return None

        found = wait_until(logged, TIMEOUT, f"{line}\n{operator.tail()}")
        return float(found)

    def ticked(self, operator: Operator, name: str) -> None:
        """Wait until ``operator``'s feedback loop has decided for ``name`` (its debug line;
        the loop ticks every 15 s)."""
        line = f"feedback {self.namespace}/{name}: ticked"
        wait_until(lambda: line in operator.log_since_start(), TIMEOUT,
                   f"{line}\n{operator.tail()}")  # fmt: skip

    def resumed(self, operator: Operator) -> float:
        """When ``operator`` became active (its kopf log line), epoch s."""
        rows = [r for r in operator.log_since_start().splitlines() if RESUMED in r]
        assert rows, f"{operator.log_path.name} never became active\n{operator.tail()}"
        return _logged_at(rows[0])

    def peers(self) -> dict[str, Any]:
        """The KopfPeering's status: one keep-alive record per live replica."""
        found: dict[str, Any] = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            "kopf.dev", "v1", self.namespace, "kopfpeerings", PEERING
        )
        return dict(found.get("status") or {})

    def active_identity(self) -> str:
        """The kopf identity of the live replica with the highest priority."""
        peers = self.peers()
        return max(peers, key=lambda identity: int(peers[identity]["priority"]))


def _logged_at(row: str) -> float:
    """The time of a kopf log line: ``[2025-01-31 12:00:00,123] ...`` (local time)."""
    stamp = row[1 : row.index("]")]
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.fixture(scope="module")
def ha(cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    suffix = uuid.uuid4().hex[:6]
    namespace, release = f"ha-{suffix}", f"ha-{suffix}"
    cluster.create_namespace(namespace)
    cluster.helm("install", release, str(CHART), "--namespace", namespace,
                 "--set", "replicaCount=2", "--set", "rbac.scope=namespace",
                 "--set", "dashboards.enabled=false", "--set", "metrics.enabled=false")  # fmt: skip
    kubeconfig = cluster.serviceaccount_kubeconfig(namespace, f"{release}-rooftop")
    work = tmp_path_factory.mktemp("peering")
    a = Operator(kubeconfig, namespace, work / "a.log")
    b = Operator(kubeconfig, namespace, work / "b.log")
    api = cluster.api()
    try:
        yield Replicas(cluster, namespace, a, b, work, api)
    finally:
        # targets first, so that the namespace goes quickly
        cluster.kubectl("delete", "st", "--all", "-n", namespace, "--timeout=60s", check=False)
        a.stop()
        b.stop()
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        api.close()


def test_one_replica_is_active_and_a_standby_takes_over(ha: Replicas) -> None:
    # Started second, b ranks lower (default priority: minus the start time) and waits.
    ha.start(ha.a)
    ha.start(ha.b)
    ha.create_target("ha-first")
    ha.reconciled(ha.a, "ha-first")
    assert RESUMED in ha.a.log_since_start()
    assert RESUMED not in ha.b.log_since_start()
    assert f"[{ha.namespace}/" not in ha.b.log_since_start()  # b saw no target at all
    assert len(ha.peers()) == 2
    ha.ticked(ha.a, "ha-first")  # only the active replica runs the feedback loop
    assert LOOP_RUNNING in ha.a.log_since_start()
    assert LOOP_RUNNING not in ha.b.log_since_start()

    # kill -9: a leaves its keep-alive behind; b takes over once it expires.
    assert ha.a.proc is not None
    killed = time.time()
    ha.a.proc.send_signal(signal.SIGKILL)
    ha.a.proc.wait()
    ha.create_target("ha-after-kill")
    kill_failover = ha.reconciled(ha.b, "ha-after-kill") - killed
    active = ha.resumed(ha.b) - killed
    print(f"\nkill -9 (lifetime {LIFETIME_S} s): the standby was active after {active:.1f} s "
          f"and had reconciled a new target after {kill_failover:.1f} s")  # fmt: skip
    assert kill_failover < LIFETIME_S + 30
    ha.reconciled(ha.b, "ha-first")  # the new active one resumes the existing target too
    ha.ticked(ha.b, "ha-first")  # and its feedback loop

    # a comes back; now it is the younger one and stands by.
    ha.start(ha.a)
    ha.create_target("ha-while-standby")
    ha.reconciled(ha.b, "ha-while-standby")
    assert f"[{ha.namespace}/" not in ha.a.log_since_start()
    assert LOOP_RUNNING not in ha.a.log_since_start()
    # b cleaned the dead replica's record up; the live two remain
    wait_until(lambda: len(ha.peers()) == 2, TIMEOUT, f"two keep-alives: {ha.peers()}")

    # SIGTERM: b removes its keep-alive as it stops, so a resumes without waiting for it
    # to expire.
    assert ha.b.proc is not None
    b_identity = ha.active_identity()
    stopped = time.time()
    ha.b.proc.send_signal(signal.SIGTERM)
    ha.create_target("ha-after-sigterm")
    term_failover = ha.reconciled(ha.a, "ha-after-sigterm") - stopped
    active = ha.resumed(ha.a) - stopped
    print(f"SIGTERM: the standby was active after {active:.2f} s and had reconciled a new "
          f"target after {term_failover:.1f} s")  # fmt: skip
    assert ha.b.proc.wait(timeout=30) == 0
    assert b_identity not in ha.peers() and len(ha.peers()) == 1
    assert term_failover < 10


def test_cluster_wide_replicas_peer_through_a_cluster_kopf_peering(
    cluster: ClusterHandle, tmp_path: Path
) -> None:
    """The chart's default scope: an operator watching all namespaces peers through the
    ClusterKopfPeering the chart creates, with the ClusterRole's rule for it."""
    suffix = uuid.uuid4().hex[:6]
    namespace, release = f"hac-{suffix}", f"hac-{suffix}"
    cluster.create_namespace(namespace)
    cluster.helm("install", release, str(CHART), "--namespace", namespace,
                 "--set", "replicaCount=2", "--set", "dashboards.enabled=false",
                 "--set", "metrics.enabled=false")  # fmt: skip
    kubeconfig = cluster.serviceaccount_kubeconfig(namespace, f"{release}-rooftop")
    operator = Operator(kubeconfig, namespace, tmp_path / "operator.log")
    api = cluster.api()
    objects = client.CustomObjectsApi(api)

    def peers() -> dict[str, Any]:
        found = objects.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", PEERING)
        return dict(found.get("status") or {})

    replicas = Replicas(cluster, namespace, operator, operator, tmp_path, api)
    try:
        operator.start("--all-namespaces", "--peering", PEERING)
        replicas.create_target("ha-cluster")
        replicas.reconciled(operator, "ha-cluster")
        assert RESUMED in operator.log_since_start() and len(peers()) == 1
        cluster.kubectl("delete", "st", "ha-cluster", "-n", namespace, "--timeout=60s")
        operator.stop()
        assert peers() == {}  # the stopped replica removed its keep-alive
    finally:
        operator.stop()
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        api.close()
