"""Engine settings the chart hands the operator, on the real local control plane: the
engine pods' Pod Security level and the engine PodMonitors' extra labels.

The kube-apiserver's PodSecurity admission plugin is on by default since Kubernetes
1.25 (tests/cluster/controlplane.py does not turn it off). It judges pods, not
Deployments: the engine Deployment is always accepted, and a refused pod shows as a
FailedCreate event from the ReplicaSet controller, naming the violated level, with no
pod. These tests read exactly that for a ``mode: vllm`` target, the real vLLM pod spec
(kwok runs no container, so nothing here tells whether vLLM itself runs as uid 1000).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from rooftop_planner.catalog import Catalog, load_catalog
from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.operator_process import Operator
from tests.e2e.test_operator import (
    CHART,
    ENGINE,
    POD_MONITOR_CRD,
    ROOT,
    TIMEOUT,
    Env,
    ensure_gpu_nodes,
    expected_plan,
    load,
)

pytestmark = pytest.mark.e2e

ENFORCE = "pod-security.kubernetes.io/enforce"
Obj = dict[str, Any]


@dataclass
class Install:
    """One release of the chart (cluster RBAC), whose ServiceAccount the operators use."""

    cluster: ClusterHandle
    api: Any
    kubeconfig: Path
    catalog: Catalog
    work: Path
    nodes: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def install(cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    suffix = uuid.uuid4().hex[:6]
    system, release = f"ps-system-{suffix}", f"ps-{suffix}"
    cluster.create_namespace(system)
    cluster.helm("install", release, str(CHART), "--namespace", system, "--set", "image.tag=e2e",
                 "--set", "dashboards.enabled=false", "--set", "metrics.enabled=false")  # fmt: skip
    kubeconfig = cluster.serviceaccount_kubeconfig(system, f"{release}-rooftop")
    api = cluster.api()
    inst = Install(cluster, api, kubeconfig, load_catalog(), tmp_path_factory.mktemp("podsec"))
    try:
        yield inst
    finally:
        cluster.helm("uninstall", release, "--namespace", system, check=False)
        cluster.kubectl("delete", "namespace", system, "--wait=false", check=False)
        for node in inst.nodes:
            cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        api.close()


@contextlib.contextmanager
def guarded(install: Install, enforce: str, pod_security: str, **more: str) -> Iterator[Env]:
    """A namespace enforcing Pod Security ``enforce`` and an operator for it started
    with ROOFTOP_ENGINE_POD_SECURITY=``pod_security`` (and the ``more`` environment);
    both go afterwards."""
    namespace = f"ps-{enforce}-{uuid.uuid4().hex[:6]}"
    install.cluster.create_namespace(namespace)
    install.cluster.kubectl("label", "namespace", namespace, f"{ENFORCE}={enforce}",
                            f"{ENFORCE}-version=latest")  # fmt: skip
    operator = Operator(install.kubeconfig, namespace, install.work / f"{namespace}.log")
    env = Env(install.cluster, install.api, namespace, operator, install.catalog, install.nodes)
    try:
        operator.start(ROOFTOP_ENGINE_POD_SECURITY=pod_security, **more)
        yield env
    finally:
        operator.stop()
        install.cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def deploy_vllm_target(env: Env, name: str) -> None:
    """examples/chat-llama-3.1-8b.yaml (``mode: vllm``) as one H100 pod, with a user
    variable the operator also sets (the user's must win, and the Deployment apply)."""
    doc = load(ROOT / "examples" / "chat-llama-3.1-8b.yaml", name=name)
    doc["spec"]["workload"]["requestsPerSecond"] = 1
    doc["spec"]["constraints"] = {"gpuTypes": ["h100-sxm"], "maxReplicas": 1}
    # a value beyond U+FFFF: JSON escapes it as a surrogate pair the API server's YAML
    # reader refuses, so the operator must write it raw for the apply to succeed
    doc["spec"]["engine"] = {
        "env": [
            {"name": "HF_HOME", "value": "/var/cache/rooftop/hf"},
            {"name": "GREETING", "value": "héllo 🚀 שלום"},
        ]
    }
    ensure_gpu_nodes(env, expected_plan(doc, env.catalog))
    env.apply(doc)
    env.wait_condition(name, "Deployed", "True")


def pod_creation(env: Env, name: str) -> tuple[list[Obj], list[str]]:
    """(engine pods, FailedCreate messages) once the ReplicaSet made a pod or was refused."""
    core = client.CoreV1Api(env.api)

    def outcome() -> tuple[list[Obj], list[str]] | None:
        pods = env.listed("Pod", f"{ENGINE},rooftop.dev/servingtarget={name}")
        events = core.list_namespaced_event(env.namespace, field_selector="reason=FailedCreate")
        refused = [str(e.message) for e in events.items]
        return (pods, refused) if pods or refused else None

    found = wait_until(outcome, TIMEOUT, f"{name}'s engine pod or its FailedCreate event")
    assert isinstance(found, tuple)
    return found


def test_restricted_engine_pods_are_admitted_by_a_restricted_namespace(install: Install) -> None:
    with guarded(install, "restricted", "restricted") as env:
        deploy_vllm_target(env, "locked")
        pods, refused = pod_creation(env, "locked")
        assert refused == [] and len(pods) == 1
        env.wait_condition("locked", "Ready", "True")
        (pod,) = env.listed("Pod", f"{ENGINE},rooftop.dev/servingtarget=locked")
        assert pod["spec"]["securityContext"]["runAsUser"] == 1000
        engine = pod["spec"]["containers"][0]
        values = {e["name"]: e.get("value") for e in engine["env"]}
        assert values["HF_HOME"] == "/var/cache/rooftop/hf"  # the user's, not ours
        assert values["GREETING"] == "héllo 🚀 שלום"
        assert values["HOME"] == "/home/rooftop"


def test_restricted_simulated_engine_pods_are_admitted_too(install: Install) -> None:
    """A simulated engine (the operator's image, its own non-root user) sets no uid."""
    with guarded(install, "restricted", "restricted") as env:
        doc = load(ROOT / "examples" / "simulated-chat.yaml", name="sim")
        ensure_gpu_nodes(env, expected_plan(doc, env.catalog))
        env.apply(doc)
        pods, refused = pod_creation(env, "sim")
        assert refused == [] and pods
        assert "runAsUser" not in pods[0]["spec"]["securityContext"]


def test_baseline_engine_pods_are_refused_by_a_restricted_namespace(install: Install) -> None:
    """What every engine pod met before the restricted level existed; it also shows
    that this cluster really enforces Pod Security, so the test above can fail."""
    with guarded(install, "restricted", "baseline") as env:
        deploy_vllm_target(env, "open")
        pods, refused = pod_creation(env, "open")
        assert pods == []
        assert any('violates PodSecurity "restricted:latest"' in m and "runAsNonRoot" in m
                   for m in refused), refused  # fmt: skip
        wait_until(lambda: env.condition("open", "Ready")["reason"] == "FailedCreate", TIMEOUT,
                   "Ready=False with reason FailedCreate")  # fmt: skip
        ready = env.condition("open", "Ready")
        assert 'violates PodSecurity "restricted:latest"' in ready["message"], ready


def test_baseline_engine_pods_are_admitted_by_a_baseline_namespace(install: Install) -> None:
    with guarded(install, "baseline", "baseline") as env:
        deploy_vllm_target(env, "plain")
        pods, refused = pod_creation(env, "plain")
        assert refused == [] and len(pods) == 1
        env.wait_condition("plain", "Ready", "True")


@contextlib.contextmanager
def pod_monitor_api(install: Install) -> Iterator[None]:
    """The PodMonitor API served for the block (test_operator's stand-in CRD: only its
    API matters), removed afterwards so later tests see a cluster without it."""
    name = POD_MONITOR_CRD["metadata"]["name"]
    if install.cluster.kubectl("get", "crd", name, check=False).returncode == 0:
        pytest.skip("a PodMonitor CRD is installed; not replacing it")
    crd_file = install.work / "podmonitor-crd.yaml"
    crd_file.write_text(yaml.safe_dump(POD_MONITOR_CRD))
    install.cluster.kubectl("apply", "-f", str(crd_file))
    try:
        install.cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                                f"crd/{name}")  # fmt: skip
        yield
    finally:
        install.cluster.kubectl("delete", "crd", name, check=False)


def labelled_pod_monitors(env: Env, selector: str) -> list[str]:
    found = client.CustomObjectsApi(env.api).list_namespaced_custom_object(
        "monitoring.coreos.com", "v1", env.namespace, "podmonitors", label_selector=selector
    )
    return [str(m["metadata"]["name"]) for m in found["items"]]


def test_pod_monitor_labels_reach_existing_pod_monitors_after_a_restart(install: Install) -> None:
    """docs/engine.md's `helm upgrade --set engine.podMonitor.labels.release=...`: the
    operator restarts with ROOFTOP_PODMONITOR_LABELS, and the PodMonitors it made before
    get the label, so `kubectl get podmonitor -l release=kps` finds them."""
    with pod_monitor_api(install), guarded(install, "baseline", "baseline") as env:
        doc = load(ROOT / "examples" / "simulated-chat.yaml", name="watched")
        ensure_gpu_nodes(env, expected_plan(doc, env.catalog))
        env.apply(doc)
        env.wait_condition("watched", "Deployed", "True")
        managed = labelled_pod_monitors(env, "app.kubernetes.io/managed-by=rooftop")
        assert managed == ["watched-engine"]
        assert labelled_pod_monitors(env, "release=kps") == []
        env.operator.stop()
        env.operator.start(ROOFTOP_ENGINE_POD_SECURITY="baseline",
                           ROOFTOP_PODMONITOR_LABELS='{"release": "kps"}')  # fmt: skip
        wait_until(lambda: labelled_pod_monitors(env, "release=kps") == ["watched-engine"],
                   TIMEOUT, "the release label on watched-engine")  # fmt: skip
