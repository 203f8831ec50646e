"""Smoke tests of the harness itself: GPU scheduling on kwok nodes, RBAC-bound
ServiceAccount credentials, and a real Prometheus scraping a local /metrics endpoint.
If these fail, every other e2e test would fail for reasons unrelated to Rooftop."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.nodes import H100
from tests.cluster.prometheus import PrometheusServer

pytestmark = pytest.mark.e2e


@pytest.fixture
def namespace(cluster: ClusterHandle) -> Iterator[str]:
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _gpu_deployment(name: str, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    container = {
        "name": "engine",
        "image": "registry.invalid/engine:0",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": H100.product},
                    "containers": [container],
                },
            },
        },
    }


def _pods(cluster: ClusterHandle, namespace: str, app: str) -> list[Any]:
    with cluster.api() as api:
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"app={app}")
    return list(pods.items)


def _condition(pod: Any, kind: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def test_eight_gpu_pod_runs_on_an_h100_node(cluster: ClusterHandle, namespace: str) -> None:
    manifest = json.dumps(_gpu_deployment("fits", 8))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)

    def running() -> Any:
        pods = _pods(cluster, namespace, "fits")
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    pod = wait_until(running, 60, "the 8-GPU pod to be Running")
    with cluster.api() as api:
        node = client.CoreV1Api(api).read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == H100.product
    assert node.status.allocatable["nvidia.com/gpu"] == "8"


def test_nine_gpu_pod_stays_pending(cluster: ClusterHandle, namespace: str) -> None:
    manifest = json.dumps(_gpu_deployment("too-big", 9))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)

    def unschedulable() -> Any:
        pods = _pods(cluster, namespace, "too-big")
        cond = _condition(pods[0], "PodScheduled") if pods else None
        return cond if cond is not None and cond.reason == "Unschedulable" else None

    cond = wait_until(unschedulable, 60, "the 9-GPU pod to be reported Unschedulable")
    assert cond.status == "False"
    assert "nvidia.com/gpu" in cond.message
    assert _pods(cluster, namespace, "too-big")[0].status.phase == "Pending"


def test_serviceaccount_kubeconfig_is_bound_by_rbac(cluster: ClusterHandle, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "robot", "-n", namespace)
    sa_config = cluster.serviceaccount_kubeconfig(namespace, "robot")
    as_robot = ("--kubeconfig", str(sa_config), "auth", "can-i", "list", "pods", "-n", namespace)
    assert cluster.kubectl(*as_robot, check=False).stdout.strip() == "no"
    cluster.kubectl(
        "create", "rolebinding", "robot-view", "--clusterrole=view",
        f"--serviceaccount={namespace}:robot", "-n", namespace,
    )  # fmt: skip
    assert cluster.kubectl(*as_robot, check=False).stdout.strip() == "yes"


def test_helm_runs(cluster: ClusterHandle) -> None:
    assert "v3." in cluster.helm("version", "--short").stdout


class _Metrics(BaseHTTPRequestHandler):
    body = b"# TYPE rooftop_smoke_value gauge\nrooftop_smoke_value 42\n"

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def test_prometheus_scrapes_a_file_sd_target(prometheus: PrometheusServer) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        prometheus.set_targets([(f"127.0.0.1:{server.server_port}", {"pod": "smoke-0"})])
        result = prometheus.wait_for('rooftop_smoke_value{pod="smoke-0"}', timeout=30)
        assert float(result[0]["value"][1]) == 42
        assert result[0]["metric"]["job"] == "rooftop"
    finally:
        server.shutdown()
        server.server_close()
