"""The operator as users run it: installed with helm, a pod on the real node.

Everywhere else the operator is a host process. Here the chart installs it from the
locally built image (tests/cluster/build-images.sh), on the real kubelet node, and it
reaches the API server through the `kubernetes` Service as on any cluster
(tests/cluster/apiserver_relay.py). With the chart's ``engine.podSecurity: restricted``
it then deploys two targets onto the same node:

1. a ``mode: simulated`` target: its engine runs in the operator's own image, asks for
   no GPU, and answers a streamed completion through its ClusterIP Service;
2. a ``mode: vllm`` target in a namespace that enforces Pod Security "restricted",
   loading the tiny model from a PersistentVolumeClaim (``spec.engine.modelVolume``):
   admitted, Ready as a non-root user on a read-only root filesystem, and serving
   through its ClusterIP Service.

Harness adaptations: kube-proxy routes the `kubernetes` Service to a relay on the
node's bridge address (the local API server listens on 127.0.0.1), and a mutating
webhook lowers the vLLM pod's CPU and memory requests (the "8-GPU" node has this
machine's 2 cores), as in tests/e2e/test_zero_loss.py.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.apiserver_relay import api_server_for_pods
from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.keepalive import KeptAliveClient
from tests.cluster.realnode import ENGINE_IMAGE, OPERATOR_IMAGE, REAL_NODE_LABEL, RealNode
from tests.cluster.requests_webhook import RequestsWebhook
from tests.e2e.test_real_node import _build, real_node  # noqa: F401 (fixture)
from tests.e2e.test_zero_loss import CLAIM, SERVED, _model_claim, target

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.realnode]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rooftop"
RELEASE = "in-pod"
PORT = 8000
READY_TIMEOUT_S = 300
OPERATOR_READY_S = 120


@dataclass
class Installed:
    cluster: ClusterHandle
    node: RealNode
    system: str
    namespace: str  # enforces Pod Security "restricted"
    operator_pod: dict[str, Any]

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> Any:
        return self.cluster.kubectl("-n", self.namespace, *args, check=check, stdin=stdin)

    def deploy(self, target: dict[str, Any]) -> dict[str, Any]:
        """Apply a ServingTarget; its first engine pod once Ready."""
        self.kubectl("apply", "-f", "-", stdin=json.dumps(target))
        selector = f"rooftop.dev/servingtarget={target['metadata']['name']}"
        try:
            pod = wait_until(lambda: _one_ready(self.cluster, self.namespace, selector),
                             READY_TIMEOUT_S, "the engine pod Ready")  # fmt: skip
        except TimeoutError:
            pytest.fail(self.debug())
        assert isinstance(pod, dict)
        return pod

    def debug(self) -> str:
        pods = self.kubectl("get", "pods", "-o", "wide", check=False).stdout
        events = self.kubectl("get", "events", "--sort-by=.lastTimestamp", check=False).stdout
        logs = self.cluster.kubectl("-n", self.system, "logs", "deploy/" + f"{RELEASE}-rooftop",
                                    "--tail=30", check=False).stdout  # fmt: skip
        engines = self.kubectl("logs", "-l", "app.kubernetes.io/name=rooftop-engine",
                               "--previous", "--tail=40", check=False)  # fmt: skip
        return (
            f"pods:\n{pods}\nevents:\n{events[-2500:]}\noperator:\n{logs[-2000:]}\n"
            f"engines, previous container:\n{engines.stdout}{engines.stderr}"
        )


def _helm_values(node: RealNode) -> list[str]:
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    values = {
        "image.repository": repository, "image.tag": tag, "image.pullPolicy": "Never",
        "nodeSelector." + REAL_NODE_LABEL.replace(".", "\\."): "true",  # helm escapes dots
        "operator.vllmImage": ENGINE_IMAGE, "engine.podSecurity": "restricted",
    }  # fmt: skip
    return [arg for k, v in values.items() for arg in ("--set-string", f"{k}={v}")]


def _pods(cluster: ClusterHandle, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _one_ready(cluster: ClusterHandle, namespace: str, selector: str) -> dict[str, Any] | None:
    ready = [p for p in _pods(cluster, namespace, selector) if _ready(p)]
    return ready[0] if ready else None


def _operator_debug(cluster: ClusterHandle, system: str) -> str:
    describe = cluster.kubectl("-n", system, "describe", "pods", check=False).stdout
    logs = cluster.kubectl("-n", system, "logs", f"deploy/{RELEASE}-rooftop", "--tail=40",
                           check=False)  # fmt: skip
    return f"operator pod not Ready:\n{describe[-4000:]}\n{logs.stdout}{logs.stderr}"


@pytest.fixture(scope="module")
def installed(
    cluster: ClusterHandle,
    real_node: RealNode,  # noqa: F811 (the imported fixture)
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installed]:
    work = tmp_path_factory.mktemp("in-pod")
    _build("build-images.sh", "operator", log=work / "build-images.log")
    real_node.import_images(OPERATOR_IMAGE)
    suffix = uuid.uuid4().hex[:6]
    system, namespace = f"inpod-system-{suffix}", f"inpod-{suffix}"
    cluster.create_namespace(system)
    cluster.create_namespace(namespace)
    cluster.kubectl("label", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=restricted")  # fmt: skip
    with api_server_for_pods(cluster, real_node.gateway):
        cluster.helm("install", RELEASE, str(CHART), "--namespace", system,
                     *_helm_values(real_node))  # fmt: skip
        try:
            selector = "app.kubernetes.io/instance=" + RELEASE
            try:
                pod = wait_until(lambda: _one_ready(cluster, system, selector),
                                 OPERATOR_READY_S, "the operator pod Ready")  # fmt: skip
            except TimeoutError:
                pytest.fail(_operator_debug(cluster, system))
            assert isinstance(pod, dict)
            yield Installed(cluster, real_node, system, namespace, pod)
        finally:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
            cluster.helm("uninstall", RELEASE, "--namespace", system, check=False)
            cluster.kubectl("delete", "namespace", system, "--wait=false", check=False)


def test_the_operator_runs_as_the_charts_pod_on_the_real_node(installed: Installed) -> None:
    pod = installed.operator_pod
    assert pod["spec"]["nodeName"] == installed.node.name
    assert pod["spec"]["containers"][0]["image"] == OPERATOR_IMAGE
    # in-cluster credentials: the projected ServiceAccount token, not a kubeconfig
    env = {e["name"] for e in pod["spec"]["containers"][0].get("env") or []}
    assert "KUBECONFIG" not in env


def _served(installed: Installed, name: str, model: str) -> None:
    ip = installed.kubectl("get", "service", name, "-o", "jsonpath={.spec.clusterIP}").stdout

    def attempt() -> KeptAliveClient | None:
        client = KeptAliveClient(ip, PORT, model, (32, 16))
        client.run()
        # a Ready pod can reach kube-proxy's rules a moment later: until then the
        # ClusterIP has no endpoint and refuses the connection
        return None if "ConnectionRefused" in (client.first.error or "") else client

    try:
        client = wait_until(attempt, 30, "kube-proxy to route the Service to the pod")
    except TimeoutError:
        pytest.fail(f"the ClusterIP of {name} still refuses connections")
    assert isinstance(client, KeptAliveClient)
    if not client.served():
        logs = installed.kubectl("logs", "-l", f"rooftop.dev/servingtarget={name}", "--tail=80",
                                 check=False).stdout  # fmt: skip
        pytest.fail(f"{client.first}\n{client.second}\nengine log:\n{logs}")


def _simulated(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "rooftop.dev/v1alpha1",
        "kind": "ServingTarget",
        "metadata": {"name": name},
        "spec": {
            "model": "llama-3.1-8b",
            "mode": "simulated",
            "slo": {"tpotMs": 50, "ttftMs": 2000},
            "workload": {"requestsPerSecond": 1, "promptTokens": {"mean": 64},
                         "outputTokens": {"mean": 32}},
            "budget": {"usdPerHour": 20},
            "constraints": {"nodeSelector": {REAL_NODE_LABEL: "true"}},
        },
    }  # fmt: skip


def test_a_simulated_target_runs_in_the_operator_image_without_a_gpu(
    installed: Installed,
) -> None:
    name = "sim"
    pod = installed.deploy(_simulated(name))
    container = pod["spec"]["containers"][0]
    assert pod["spec"]["nodeName"] == installed.node.name
    assert container["image"] == OPERATOR_IMAGE
    assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
    _served(installed, name, "llama-3.1-8b")
    installed.kubectl("delete", "servingtarget", name, "--wait=false")


@contextlib.contextmanager
def readable_copy(model_dir: Path) -> Iterator[Path]:
    """The model where the engine's non-root user can read it: pytest's own
    directories are root's alone (0700), and fsGroup does not apply to a hostPath."""
    shared = Path(tempfile.mkdtemp(prefix="rooftop-model-"))
    try:
        model = Path(shutil.copytree(model_dir, shared / model_dir.name))
        for path in [shared, *shared.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield model
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture
def readable_model(tiny_model_dir: Path) -> Iterator[Path]:
    with readable_copy(tiny_model_dir) as model:
        yield model


def test_a_vllm_target_serves_under_restricted_pod_security_with_a_pvc_model(
    installed: Installed, readable_model: Path, tmp_path: Path
) -> None:
    tiny_model_dir = readable_model
    pv = f"inpod-models-{uuid.uuid4().hex[:6]}"
    _model_claim(installed.cluster, tmp_path, installed.namespace, pv, tiny_model_dir.parent)
    webhook = RequestsWebhook(installed.cluster, installed.namespace, cpu="500m",
                              memory="4Gi").install()  # fmt: skip
    doc = target(tiny_model_dir, 1)
    name = doc["metadata"]["name"]
    try:
        pod = installed.deploy(doc)
        security = pod["spec"]["securityContext"]
        assert security["runAsNonRoot"] is True and security.get("fsGroup")
        container = pod["spec"]["containers"][0]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]  # fmt: skip
        assert claims == [CLAIM]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        # a two-token first request: what killed a fresh CPU engine before the vLLM
        # venv asked for AMX permission (tests/engine/amx_permission.py)
        _served(installed, name, SERVED)
    finally:
        installed.kubectl("delete", "servingtarget", name, "--wait=false", check=False)
        webhook.close()
        installed.cluster.kubectl("delete", "pv", pv, "--wait=false", check=False)
