"""A real node (containerd + kubelet + kube-proxy) running the real vLLM image.

Why: everywhere else pods are kwok's and never run, so images, container commands,
probes, Service routing and SIGTERM handling are only assumed. Here one real kubelet
node (tests/cluster/realnode.py) joins the local control plane as an H100 node (GPU
Feature Discovery labels, `nvidia.com/gpu` capacity), and:

1. it registers and turns Ready, with its GPUs allocatable, and runs the Rooftop image
   (the Containerfile's, assembled by build-images.sh) under the chart's security context;
2. a Deployment of the locally built vLLM CPU image (tests/cluster/build-images.sh)
   requesting one GPU and serving the tiny model (tests/engine/tiny_model.py, mounted
   from the host) lands on it and turns Ready;
3. a streamed /v1/completions request sent from this host to the ClusterIP Service
   (kube-proxy's rules are the only route to a pod) ends with ``data: [DONE]``;
4. scaling the pod away mid-stream runs Rooftop's preStop (the drain middleware,
   tests/e2e/test_engine_drain.py) and then SIGTERM, and vLLM drains: a client that
   keeps its connection alive through the ClusterIP gets its stream and its next
   request on that connection served, each ending with ``data: [DONE]``.

Needs root, the node's binaries (build-node.sh) and images (build-images.sh): in CI,
or with ROOFTOP_BUILD_TOOLS=1, they are built here (cached; the first engine image
build and import take a few minutes); otherwise the tests skip with a hint.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rooftop_operator import builders
from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.keepalive import KeptAliveClient
from tests.cluster.nodes import H100
from tests.cluster.realnode import (
    ENGINE_IMAGE,
    OPERATOR_IMAGE,
    PAUSE_IMAGE,
    REAL_NODE_LABEL,
    RealNode,
    missing_images,
    missing_node_binaries,
)

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.realnode]

CLUSTER_DIR = Path(__file__).resolve().parents[1] / "cluster"
SERVED = "tiny"
PORT = 8000
SHUTDOWN_TIMEOUT_S = 30
PRESTOP_S = 1
READY_TIMEOUT_S = 300
# The tiny model streams ~600 tokens/s on 2 cores; 20 logprobs per token slow that to
# ~400/s, so 2,000 tokens (its whole context) outlive the preStop sleep several times.
DRAIN_TOKENS, DRAIN_LOGPROBS = 2000, 20


def _unavailable(msg: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{msg} (CI: e2e tests may not skip)", pytrace=False)
    pytest.skip(msg)


def _build(script: str, *args: str, log: Path) -> None:
    """Run build-node.sh / build-images.sh (both cached); skip or fail with its log."""
    with log.open("w") as err:
        done = subprocess.run([str(CLUSTER_DIR / script), *args], stdout=subprocess.DEVNULL,
                              stderr=err)  # fmt: skip
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        _unavailable(f"{script} failed ({log}):\n{tail}")


@pytest.fixture(scope="module")
def real_node(
    cluster: ClusterHandle, vllm_py: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealNode]:
    """The real node, joined to the session's local control plane for this module."""
    if os.geteuid() != 0:
        _unavailable("a real node needs root (kubelet, containerd, network setup)")
    logs = tmp_path_factory.mktemp("real-node-build")
    build = bool(os.environ.get("CI") or os.environ.get("ROOFTOP_BUILD_TOOLS"))
    if missing_node_binaries():
        if not build:
            _unavailable(f"node binaries missing {missing_node_binaries()}: run "
                         "tests/cluster/build-node.sh")  # fmt: skip
        _build("build-node.sh", log=logs / "build-node.log")
    images = (PAUSE_IMAGE, ENGINE_IMAGE)
    # Cheap when nothing changed (input hashes); builds on a fresh machine.
    if missing_images(images) and not build:
        _unavailable(f"images missing {missing_images(images)}: run tests/cluster/build-images.sh")
    _build("build-images.sh", "pause", "engine", log=logs / "build-images.log")
    try:
        node = RealNode.for_kubeconfig(cluster.kubeconfig, images=images, die_with_parent=True)
    except FileNotFoundError as err:
        pytest.skip(f"a real node joins only the local control plane: {err}")
    node.start(timeout=900)  # a cold start imports the ~7 GB engine image once
    print(f"\nreal node started: {node.timings}")
    try:
        yield node
    finally:
        node.stop()


def test_node_registers_ready_as_gpu_node(real_node: RealNode, cluster: ClusterHandle) -> None:
    node = json.loads(cluster.kubectl("get", "node", real_node.name, "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True", conditions
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == H100.product
    assert labels["nvidia.com/gpu.count"] == str(H100.gpus)
    assert labels[REAL_NODE_LABEL] == "true"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(H100.gpus)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.34.3"
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    assert not node["spec"].get("taints")  # as the kwok GPU nodes: untainted


def test_operator_image_runs_under_the_charts_security_context(
    real_node: RealNode, cluster: ClusterHandle, tmp_path: Path
) -> None:
    """The Rooftop image's entrypoint and user, with the chart's pod security (non-root,
    read-only root filesystem, /tmp mounted)."""
    _build("build-images.sh", "operator", log=tmp_path / "build-images.log")
    real_node.import_images(OPERATOR_IMAGE)
    namespace = f"real-node-op-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rooftop-version"},
        "spec": {
            "nodeName": real_node.name,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "rooftop",
                "image": OPERATOR_IMAGE,
                "imagePullPolicy": "Never",
                "args": ["--version"],  # the image's ENTRYPOINT is `rooftop`
                "securityContext": {"readOnlyRootFilesystem": True,
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }  # fmt: skip
    try:
        cluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(pod))

        def phase() -> str | None:
            out = cluster.kubectl("-n", namespace, "get", "pod", "rooftop-version", "-o",
                                  "jsonpath={.status.phase}").stdout  # fmt: skip
            return out if out in ("Succeeded", "Failed") else None

        assert wait_until(phase, 60, "the rooftop pod to finish") == "Succeeded"
        logs = cluster.kubectl("-n", namespace, "logs", "rooftop-version").stdout
        assert logs.startswith("rooftop"), logs
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# ---------------------------------------------------------------- the engine


def engine_manifests(node: RealNode, model_dir: Path) -> list[dict[str, Any]]:
    """What the operator builds for a vLLM target, cut to what this test needs: the GPU
    node selector and toleration, a GPU request, /health probes, and the drain: the
    middleware's ConfigMap on PYTHONPATH, its preStop and --shutdown-timeout, as
    ``builders`` renders them."""
    labels = {"app": "engine"}
    container = {
        "name": "engine",
        "image": ENGINE_IMAGE,
        "imagePullPolicy": "Never",  # local image; nothing may be pulled
        "args": [
            "/models/tiny", "--served-model-name", SERVED, "--port", str(PORT),
            "--max-model-len", "2048", "--max-num-seqs", "4",
            "--max-logprobs", str(DRAIN_LOGPROBS),
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
            "--middleware", builders.DRAIN_MIDDLEWARE,
        ],
        "env": [
            {"name": "PYTHONPATH", "value": builders.DRAIN_MOUNT},
            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},  # GiB
        ],
        "ports": [{"name": "http", "containerPort": PORT}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
        "lifecycle": {"preStop": {"exec": {"command": [
            "python3", f"{builders.DRAIN_MOUNT}/{builders.DRAIN_MODULE}.py", "--port", str(PORT),
            "--min-s", str(PRESTOP_S), "--max-s", str(PRESTOP_S + SHUTDOWN_TIMEOUT_S)]}}},
        "volumeMounts": [
            {"name": builders.DRAIN_VOLUME, "mountPath": builders.DRAIN_MOUNT, "readOnly": True},
            {"name": "model", "mountPath": "/models/tiny", "readOnly": True},
            # vLLM's CPU executor needs more shared memory than the runtime's 64 MiB
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }  # fmt: skip
    pod_spec = {
        "nodeSelector": {
            "kubernetes.io/hostname": node.name,
            "nvidia.com/gpu.product": node.gpu.product,
        },
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": PRESTOP_S + 2 * SHUTDOWN_TIMEOUT_S + 10,
        "containers": [container],
        "volumes": [
            {"name": "model", "hostPath": {"path": str(model_dir), "type": "Directory"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            {"name": builders.DRAIN_VOLUME, "configMap": {"name": "engine"}},
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "engine", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "engine"},
        "spec": {"selector": labels, "ports": [{"port": PORT, "targetPort": "http"}]},
    }
    drain = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "engine"},
             "data": {f"{builders.DRAIN_MODULE}.py": builders.drain_source()}}  # fmt: skip
    return [drain, deployment, service]


@dataclass
class Engine:
    cluster: ClusterHandle
    namespace: str
    cluster_ip: str
    pod: str
    ready_s: float
    timings: dict[str, float] = field(default_factory=dict)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("-n", self.namespace, *args, check=check)


def _ready_pods(engine_ns: str, cluster: ClusterHandle) -> list[dict[str, Any]]:
    pods = json.loads(
        cluster.kubectl("-n", engine_ns, "get", "pods", "-l", "app=engine", "-o", "json").stdout
    )["items"]
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions") or []
        )
    ]


@pytest.fixture(scope="module")
def engine(real_node: RealNode, cluster: ClusterHandle, tiny_model_dir: Path) -> Iterator[Engine]:
    """The engine Deployment and its Service, Ready; time-to-Ready measured from the
    Deployment's creation (scheduling, sandbox, container start, vLLM start-up)."""
    namespace = f"real-node-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace)
    manifests = engine_manifests(real_node, tiny_model_dir)
    t0 = time.monotonic()
    items = {"apiVersion": "v1", "kind": "List", "items": manifests}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(items))
    try:
        try:
            pods = wait_until(lambda: _ready_pods(namespace, cluster), READY_TIMEOUT_S,
                              "the engine pod Ready on the real node")  # fmt: skip
        except TimeoutError:
            describe = cluster.kubectl("-n", namespace, "describe", "pods", check=False).stdout
            logs = cluster.kubectl("-n", namespace, "logs", "deploy/engine", "--tail=40",
                                   check=False)  # fmt: skip
            pytest.fail(f"engine not Ready:\n{describe[-3000:]}\n{logs.stdout}{logs.stderr}")
        ready_s = time.monotonic() - t0
        print(f"\nengine pod Ready {ready_s:.1f}s after the Deployment was created")
        assert isinstance(pods, list)
        ip = cluster.kubectl("-n", namespace, "get", "service", "engine", "-o",
                             "jsonpath={.spec.clusterIP}").stdout  # fmt: skip
        yield Engine(cluster, namespace, ip, pods[0]["metadata"]["name"], ready_s)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def stream_completion(
    host: str, max_tokens: int, on_first_chunk: threading.Event | None = None, logprobs: int = 0
) -> list[str]:
    """POST a streamed /v1/completions to host:PORT; the `data:` lines as received.
    ignore_eos: the random model would otherwise stop at any step."""
    body: dict[str, Any] = {
        "model": SERVED, "prompt": "The quick", "max_tokens": max_tokens,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
        "temperature": 0,
    }  # fmt: skip
    if logprobs:
        body["logprobs"] = logprobs
    conn = http.client.HTTPConnection(host, PORT, timeout=120)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()[:500]
        events = []
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:"):
                events.append(line)
                if on_first_chunk is not None:
                    on_first_chunk.set()
        return events
    finally:
        conn.close()


def _tokens(events: list[str]) -> int:
    """Completion tokens the stream reports (its final usage chunk; a chunk may carry
    more than one token)."""
    usage = [json.loads(e[5:]).get("usage") for e in events if e != "data: [DONE]"]
    return int([u for u in usage if u][-1]["completion_tokens"])


def test_engine_becomes_ready_on_the_real_node(engine: Engine, real_node: RealNode) -> None:
    pod = json.loads(engine.kubectl("get", "pod", engine.pod, "-o", "json").stdout)
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["status"]["podIP"].startswith("10.89.0.")
    (status,) = pod["status"]["containerStatuses"]
    assert status["image"].endswith(ENGINE_IMAGE) and status["ready"]
    assert engine.ready_s < READY_TIMEOUT_S


def test_cluster_ip_routes_a_streamed_completion(engine: Engine) -> None:
    """From this host to the ClusterIP: only kube-proxy's DNAT reaches the pod."""
    events = wait_until(lambda: _try_stream(engine.cluster_ip, 16), 30, "the Service to answer")
    assert isinstance(events, list)
    assert events[-1] == "data: [DONE]"
    assert _tokens(events) == 16


def _try_stream(host: str, max_tokens: int) -> list[str] | None:
    try:
        return stream_completion(host, max_tokens)
    except (OSError, http.client.HTTPException):
        return None  # kube-proxy may not have synced the endpoints yet


def test_a_kept_alive_client_loses_nothing_when_the_pod_stops(engine: Engine) -> None:
    """Scale to zero mid-stream. The kubelet runs the preStop (the drain middleware's
    script, with the image's python3, from the ConfigMap), which tells the client to
    reconnect after its next response and waits until vLLM has taken that request;
    then SIGTERM, and vLLM drains. Both streams on the kept-alive connection through
    the ClusterIP end with [DONE] and every token."""
    logs = subprocess.Popen(
        [*_kubectl_argv(engine), "logs", "-f", engine.pod, "--tail=0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen: dict[str, float] = {}
    lines: list[str] = []

    def follow() -> None:
        assert logs.stdout is not None
        for line in logs.stdout:
            lines.append(line)
            if "shutdown triggered" in line:
                seen.setdefault("sigterm", time.monotonic())

    follower = threading.Thread(target=follow)
    follower.start()
    slow = {"logprobs": DRAIN_LOGPROBS}  # a longer step: the stream outlasts the scale call
    client = KeptAliveClient(engine.cluster_ip, PORT, SERVED, (DRAIN_TOKENS, 64), slow)
    client.start()
    assert client.first.first_chunk.wait(60), "no first chunk"
    time.sleep(1)  # kubectl logs -f is attached
    engine.kubectl("scale", "deployment", "engine", "--replicas=0")
    assert client.second.first_chunk.wait(PRESTOP_S + SHUTDOWN_TIMEOUT_S + 30)
    second_started = time.monotonic()
    client.join(SHUTDOWN_TIMEOUT_S + 30)
    wait_until(lambda: "sigterm" in seen, 30, "vLLM's SIGTERM")
    # vLLM logs the shutdown mode a moment after the trigger (its shutdown task)
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: any("mode=" in line for line in lines), 30, "vLLM's shutdown mode")
    logs.terminate()
    follower.join(10)
    text = "".join(lines)
    assert client.served(), (client.first, client.second, text[-2000:])
    assert client.kept_alive and client.first.connection_header != "close"
    assert client.second.connection_header == "close"  # the client moves to another pod
    # SIGTERM came only after vLLM had taken the second request, and vLLM drained.
    assert seen["sigterm"] > second_started - 1.0, text[-2000:]
    assert "mode=drain" in text, text[-2000:]
    hooks = engine.kubectl("get", "events", "--field-selector", "reason=FailedPreStopHook",
                           "-o", "name").stdout  # fmt: skip
    assert hooks.strip() == "", hooks


def _kubectl_argv(engine: Engine) -> list[str]:
    from tests.cluster.controlplane import find_binary

    kubectl = find_binary("kubectl", engine.cluster.bin_dir)
    assert kubectl is not None
    return [str(kubectl), f"--kubeconfig={engine.cluster.kubeconfig}", "-n", engine.namespace]
