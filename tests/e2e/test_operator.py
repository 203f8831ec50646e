"""The operator end to end, on the real local control plane with fake (kwok) GPU nodes.

The chart is installed with Helm; the operator itself runs here as a subprocess, but with
the chart's ServiceAccount credentials, so every API call it makes goes through the
chart's real RBAC. kwok marks pods on fake nodes Running and Ready, so "Ready" in these
tests means: the planned GPU selector matched a node, the scheduler bound the pods, and
the operator saw the Deployment's rollout finish.

Everything polls (tests.cluster.handle.wait_until); nothing sleeps a fixed time.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from rooftop_api.spec import ServingTarget
from rooftop_operator.builders import deployment_name
from rooftop_operator.kube import DISCOVERY_TTL_S
from rooftop_operator.settings import LoopSettings
from rooftop_planner.catalog import Catalog, load_catalog
from rooftop_planner.explain import gpus_of
from rooftop_planner.search import plan_target
from tests.cluster.controlplane import find_binary
from tests.cluster.handle import ClusterHandle, wait_until
from tests.cluster.nodes import GpuType, gpu_node
from tests.cluster.operator_process import Operator

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rooftop"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
RELEASE = "op-e2e"
SERVICE_ACCOUNT = f"{RELEASE}-rooftop"  # rooftop.fullname for this release
GROUP, VERSION, PLURAL = "rooftop.dev", "v1alpha1", "servingtargets"
ENGINE = "app.kubernetes.io/name=rooftop-engine"
TIMEOUT = 60.0

Obj = dict[str, Any]


@dataclass
class Env:
    cluster: ClusterHandle
    api: Any
    namespace: str  # where the ServingTargets live
    operator: Operator
    catalog: Catalog
    nodes: list[str] = field(default_factory=list)
    release: str = RELEASE

    # ---- reads
    def target(self, name: str) -> Obj:
        found: Obj = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return found

    def deployment(self, name: str, pool: str = "") -> Obj | None:
        """The target's engine Deployment (a mixed fleet's: its ``pool``'s)."""
        try:
            found = client.AppsV1Api(self.api).read_namespaced_deployment(
                deployment_name(name, pool), self.namespace
            )
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return dict(self.api.sanitize_for_serialization(found))

    def listed(self, kind: str, selector: str) -> list[Obj]:
        method = {
            "Pod": client.CoreV1Api(self.api).list_namespaced_pod,
            "Service": client.CoreV1Api(self.api).list_namespaced_service,
            "Deployment": client.AppsV1Api(self.api).list_namespaced_deployment,
            "ReplicaSet": client.AppsV1Api(self.api).list_namespaced_replica_set,
            "PodDisruptionBudget": client.PolicyV1Api(
                self.api
            ).list_namespaced_pod_disruption_budget,
        }[kind]
        items = method(self.namespace, label_selector=selector).items
        return [dict(self.api.sanitize_for_serialization(i)) for i in items]

    def condition(self, name: str, type_: str) -> Obj:
        for cond in self.target(name).get("status", {}).get("conditions", []):
            if cond["type"] == type_:
                return dict(cond)
        return {}

    # ---- writes
    def apply(self, doc: Obj) -> None:
        path = (
            self.operator.log_path.parent / f"{doc['metadata']['name']}-{uuid.uuid4().hex[:6]}.yaml"
        )
        path.write_text(yaml.safe_dump(doc))
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", str(path))

    # ---- waits
    def wait_condition(self, name: str, type_: str, status: str, generation: int = 1) -> Obj:
        def check() -> Obj | None:
            cond = self.condition(name, type_)
            target = self.target(name)
            seen = target.get("status", {}).get("observedGeneration", 0)
            return cond if cond.get("status") == status and seen >= generation else None

        what = f"{name} {type_}={status} (gen {generation})\n{self.operator.tail()}"
        found: Obj = wait_until(check, TIMEOUT, what)  # type: ignore[assignment]
        return found


def load(path: Path, name: str | None = None) -> Obj:
    doc: Obj = yaml.safe_load(path.read_text())
    if name:
        doc["metadata"]["name"] = name
    return doc


def expected_plan(doc: Obj, catalog: Catalog) -> Any:
    """The plan the operator deploys for ``doc`` (a mixed fleet where that is cheaper)."""
    result = plan_target(ServingTarget.model_validate(doc).spec, catalog=catalog)
    assert result.deployed is not None, result.explain()
    return result.deployed


def ensure_gpu_nodes(env: Env, plan: Any) -> None:
    """Give the planned GPU type fake nodes big enough for the plan (the default fleet
    has H100, A100 and 1-GPU L4 nodes; the examples also plan L40S, H200, GH200...)."""
    gpu = env.catalog.gpu(plan.gpu)
    core = client.CoreV1Api(env.api)
    selector = f"{gpu.node_label_key}={gpu.node_label_value}"
    nodes = core.list_node(label_selector=selector).items
    big = [n for n in nodes if int((n.status.allocatable or {}).get(gpu.resource_name, 0)) >= 8]
    if len(big) >= 2 or plan.tp > 8:
        return
    prefix = f"e2e-{gpu.id}-{uuid.uuid4().hex[:4]}"
    memory_mib = int(gpu.hbm_bytes / 2**20)
    flavour = GpuType(
        prefix,
        gpu.node_label_value,
        8,
        memory_mib,
        "e2e",
        (9, 0),
        "e2e",
        "192",
        "2Ti",
        arch=gpu.host_arch,
    )
    for i in range(2 - len(big)):
        node = gpu_node(flavour, i)
        core.create_node(node)
        env.nodes.append(node["metadata"]["name"])

    def ready() -> bool:
        found = core.list_node(label_selector=selector).items
        return (
            all(
                any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                for n in found
            )
            and len(found) >= 2
        )

    wait_until(ready, TIMEOUT, f"fake {gpu.id} nodes Ready")


def ready_example(env: Env, name: str) -> Obj:
    """examples/simulated-chat.yaml as ``name``, on fake nodes its plan fits, applied and
    Ready; returns its engine Deployment."""
    doc = load(ROOT / "examples" / "simulated-chat.yaml", name=name)
    ensure_gpu_nodes(env, expected_plan(doc, env.catalog))
    env.apply(doc)
    env.wait_condition(name, "Ready", "True")
    deployment = env.deployment(name)
    assert deployment is not None
    return deployment


@pytest.fixture(scope="module")
def env(cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    suffix = uuid.uuid4().hex[:6]
    system, targets = f"rooftop-system-{suffix}", f"targets-{suffix}"
    cluster.create_namespace(system)
    cluster.create_namespace(targets)
    cluster.helm("install", RELEASE, str(CHART), "--namespace", system,
                 "--set", "image.tag=e2e")  # fmt: skip
    kubeconfig = cluster.serviceaccount_kubeconfig(system, SERVICE_ACCOUNT)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    api = cluster.api()
    e = Env(cluster, api, targets, Operator(kubeconfig, targets, log), load_catalog())
    e.operator.start()
    try:
        yield e
    finally:
        e.operator.stop()
        cluster.kubectl("delete", "namespace", targets, "--wait=false", check=False)
        cluster.helm("uninstall", RELEASE, "--namespace", system, check=False)
        cluster.kubectl("delete", "namespace", system, "--wait=false", check=False)
        for node in e.nodes:
            cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        api.close()


# ---------------------------------------------------------------- tests


def test_chart_installs_the_crd_and_operator(env: Env) -> None:
    crds = env.cluster.kubectl("get", "crd", "servingtargets.rooftop.dev", "-o", "name")
    assert "servingtargets.rooftop.dev" in crds.stdout
    # The SA kubeconfig really is restricted: it may not read Secrets.
    kubectl = str(find_binary("kubectl", env.cluster.bin_dir))
    denied = subprocess.run(
        [kubectl, f"--kubeconfig={env.operator.kubeconfig}",
         "auth", "can-i", "get", "secrets", "-n", env.namespace],
        capture_output=True, text=True,
    )  # fmt: skip
    assert denied.stdout.strip() == "no"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_planned_deployed_and_ready(env: Env, example: Path) -> None:
    """Each example deployed on fake nodes: its Deployment (a mixed fleet's, one per
    pool) on its GPU type, its pods running, its PodDisruptionBudget and status."""
    doc = load(example)
    name, plan = doc["metadata"]["name"], expected_plan(doc, env.catalog)
    for pool in plan.pools or (plan,):
        ensure_gpu_nodes(env, pool)
    env.apply(doc)
    env.wait_condition(name, "Ready", "True")
    simulated = doc["spec"].get("mode") == "simulated"
    for pool in plan.pools or (plan,):
        gpu = env.catalog.gpu(pool.gpu)
        deployment = env.deployment(name, pool.gpu if plan.pools else "")
        assert deployment is not None
        pod_spec = deployment["spec"]["template"]["spec"]
        limits = pod_spec["containers"][0]["resources"]["limits"]
        if simulated:  # runs on any node: no GPU asked for, no GPU label required
            assert gpu.node_label_key not in pod_spec.get("nodeSelector", {})
            assert gpu.resource_name not in limits
        else:
            assert pod_spec["nodeSelector"][gpu.node_label_key] == gpu.node_label_value
            assert limits == {gpu.resource_name: str(pool.tp)}
        assert deployment["spec"]["replicas"] == pool.replicas

    pods = env.listed("Pod", f"{ENGINE},rooftop.dev/servingtarget={name}")
    assert len(pods) == plan.replicas
    core = client.CoreV1Api(env.api)
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        node = core.read_node(pod["spec"]["nodeName"])
        pool = (pod["metadata"]["labels"] or {}).get("rooftop.dev/pool", plan.gpu)
        gpu = env.catalog.gpu(pool)
        if not simulated:
            assert node.metadata.labels[gpu.node_label_key] == gpu.node_label_value

    # the real disruption controller counts the pods the PDB selects: a drain may take
    # exactly one of them at a time
    def pdb_counted() -> Obj | None:
        (pdb,) = env.listed("PodDisruptionBudget", f"rooftop.dev/servingtarget={name}")
        counted = pdb.get("status", {}).get("expectedPods") == plan.replicas
        return pdb if counted else None

    pdb = wait_until(pdb_counted, TIMEOUT, f"{name}'s PodDisruptionBudget to count its pods")
    assert pdb["status"]["disruptionsAllowed"] == 1  # type: ignore[index]

    status = env.target(name)["status"]
    assert status["plan"]["gpu"] == plan.gpu and status["plan"]["tp"] == plan.tp
    assert status["gpu"] == gpus_of(plan)
    assert status["ready"] == "True" and status["readyReplicas"] == plan.replicas
    for type_ in ("Planned", "Feasible", "Deployed", "WithinBudget"):
        assert env.condition(name, type_)["status"] == "True", type_

    table = env.cluster.kubectl("get", "st", name, "-n", env.namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "MODEL", "GPU", "TP", "REPLICAS", "BATCH", "TPOT",
                                "SLO", "$/H", "READY", "AGE"]  # fmt: skip
    row = table[1].split()
    assert row[:6] == [name, doc["spec"]["model"], gpus_of(plan), str(plan.tp),
                       str(plan.replicas), str(plan.max_num_seqs)]  # fmt: skip
    assert "True" in row


def test_slo_edit_replans_and_rolls_the_deployment(env: Env) -> None:
    doc = load(ROOT / "examples" / "chat-llama-3.1-8b.yaml", name="chat-edit")
    before = expected_plan(doc, env.catalog)
    edited = copy.deepcopy(doc)
    for tpot in (15, 12, 8, 6, 40, 60, 100):
        edited["spec"]["slo"]["tpotMs"] = tpot
        after = expected_plan(edited, env.catalog)
        if (after.gpu, after.tp, after.max_num_seqs) != (
            before.gpu,
            before.tp,
            before.max_num_seqs,
        ):
            break
    else:
        pytest.fail("no SLO edit changes the plan; adjust the candidates")
    ensure_gpu_nodes(env, before)
    ensure_gpu_nodes(env, after)
    env.apply(doc)
    env.wait_condition("chat-edit", "Ready", "True")
    first = env.deployment("chat-edit")
    assert first is not None

    env.apply(edited)
    env.wait_condition("chat-edit", "Ready", "True", generation=2)
    rolled = env.deployment("chat-edit")
    assert rolled is not None
    assert rolled["metadata"]["uid"] == first["metadata"]["uid"]  # same Deployment, rolled
    args = rolled["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == str(after.max_num_seqs)
    gpu = env.catalog.gpu(after.gpu)
    assert rolled["spec"]["template"]["spec"]["nodeSelector"][gpu.node_label_key] == (
        gpu.node_label_value
    )
    replica_sets = env.listed("ReplicaSet", "rooftop.dev/servingtarget=chat-edit")
    assert len(replica_sets) == 2  # old one scaled to 0, new one serving
    assert env.target("chat-edit")["status"]["plan"]["gpu"] == after.gpu

    def plan_changed_event() -> str:
        # kopf posts events from a background queue: the event may follow Ready
        return env.cluster.kubectl(
            "get", "events", "-n", env.namespace, "--field-selector",
            "involvedObject.name=chat-edit,reason=PlanChanged", "-o", "name",
        ).stdout.strip()  # fmt: skip

    wait_until(plan_changed_event, TIMEOUT, "a PlanChanged event")


def test_ready_names_what_keeps_the_scheduler_from_placing_pods(env: Env) -> None:
    """A pod no node fits changes no Deployment field; Ready still says why, in the
    scheduler's words, and clears once an edit (removing the selector entry in the
    way) lets the pods land."""
    doc = load(ROOT / "examples" / "simulated-chat.yaml", name="nowhere")
    ensure_gpu_nodes(env, expected_plan(doc, env.catalog))
    placed = copy.deepcopy(doc)
    doc["spec"]["constraints"]["nodeSelector"] = {"e2e.rooftop.dev/pool": "absent"}
    env.apply(doc)

    def unschedulable() -> Obj | None:
        cond = env.condition("nowhere", "Ready")
        return cond if cond.get("reason") == "Unschedulable" else None

    ready = wait_until(unschedulable, TIMEOUT, f"Unschedulable\n{env.operator.tail()}")
    assert "engine replicas ready; 1 pod(s) cannot be scheduled: 0/" in ready["message"]
    assert "didn't match Pod's node affinity/selector" in ready["message"]
    env.apply(placed)
    env.wait_condition("nowhere", "Ready", "True", generation=2)
    deployment = env.deployment("nowhere")
    assert deployment is not None  # the removed selector entry left the Deployment
    selector = deployment["spec"]["template"]["spec"].get("nodeSelector", {})
    assert "e2e.rooftop.dev/pool" not in selector  # removed (a simulated engine has no other)


def test_infeasible_target_reports_why_and_deploys_nothing(env: Env) -> None:
    doc = load(ROOT / "examples" / "chat-llama-3.1-8b.yaml", name="impossible")
    doc["spec"]["slo"]["tpotMs"] = 0.5
    env.apply(doc)
    feasible = env.wait_condition("impossible", "Feasible", "False")
    assert feasible["reason"] == "Infeasible"
    assert "0.5 ms" in feasible["message"]  # the planner's explanation
    assert env.deployment("impossible") is None
    assert not env.listed("Service", "rooftop.dev/servingtarget=impossible")


def _children(env: Env, name: str) -> dict[str, list[Obj]]:
    selector = f"rooftop.dev/servingtarget={name}"
    kinds = ("Deployment", "Service", "ReplicaSet", "PodDisruptionBudget")
    return {kind: env.listed(kind, selector) for kind in kinds}


def test_restart_is_idempotent(env: Env) -> None:
    ready_example(env, "steady")
    versions = {
        kind: [o["metadata"]["resourceVersion"] for o in objs]
        for kind, objs in _children(env, "steady").items()
    }
    status = env.target("steady")["status"]
    env.operator.stop()
    env.operator.start()
    wait_until(
        lambda: f"[{env.namespace}/steady] Resuming is processed"
        in env.operator.log_since_start(),
        TIMEOUT, "the restarted operator resumed 'steady'",
    )  # fmt: skip
    after = {
        kind: [o["metadata"]["resourceVersion"] for o in objs]
        for kind, objs in _children(env, "steady").items()
    }
    assert after == versions
    assert env.target("steady")["status"] == status


def test_sigkill_mid_reconcile_converges_without_duplicates(env: Env) -> None:
    doc = load(ROOT / "examples" / "simulated-chat.yaml", name="crashy")
    ensure_gpu_nodes(env, expected_plan(doc, env.catalog))
    env.operator.stop()
    # The fault hook pauses each reconcile right after the Deployment is applied.
    env.operator.start(ROOFTOP_FAULT_PAUSE_AFTER_APPLY_S="120")
    env.apply(doc)
    wait_until(lambda: env.deployment("crashy"), TIMEOUT, "crashy's Deployment")
    assert "plan" not in env.target("crashy").get("status", {})  # really mid-reconcile
    env.operator.stop(signal.SIGKILL)
    first_uid = env.deployment("crashy")["metadata"]["uid"]  # type: ignore[index]

    env.operator.start()
    env.wait_condition("crashy", "Ready", "True")
    target_uid = env.target("crashy")["metadata"]["uid"]
    children = _children(env, "crashy")
    assert [len(children[k]) for k in ("Deployment", "Service", "ReplicaSet")] == [1, 1, 1]
    assert len(children["PodDisruptionBudget"]) == 1
    assert children["Deployment"][0]["metadata"]["uid"] == first_uid
    for objs in (children["Deployment"], children["Service"], children["PodDisruptionBudget"]):
        owners = objs[0]["metadata"]["ownerReferences"]
        assert [o["uid"] for o in owners] == [target_uid]


def test_deleted_engine_deployment_is_recreated(env: Env) -> None:
    old = ready_example(env, "drift")
    env.cluster.kubectl("delete", "deployment", "drift-engine", "-n", env.namespace)

    def replaced() -> Obj | None:
        new = env.deployment("drift")
        return new if new and new["metadata"]["uid"] != old["metadata"]["uid"] else None

    wait_until(replaced, TIMEOUT, f"drift-engine to be recreated\n{env.operator.tail()}")
    wait_until(lambda: env.condition("drift", "Ready").get("status") == "True", TIMEOUT,
               "drift Ready again")  # fmt: skip


def test_delete_garbage_collects_children(env: Env) -> None:
    """No cleanup of the operator's own: Kubernetes' garbage collector removes the
    children through their ownerReferences, and no finalizer holds the target. On a
    fresh cluster this takes up to ~30 s, because the collector starts watching a newly
    installed CRD's kind only at its next periodic resync."""
    ready_example(env, "doomed")
    assert not env.target("doomed")["metadata"].get("finalizers")
    env.cluster.kubectl("delete", "st", "doomed", "-n", env.namespace, "--wait=true")
    selector = "rooftop.dev/servingtarget=doomed"

    def gone() -> bool:
        kinds = ("Deployment", "Service", "PodDisruptionBudget", "Pod")
        return not any(env.listed(kind, selector) for kind in kinds)

    wait_until(gone, 2 * TIMEOUT, "doomed's Deployment, Service, PDB and pods to be collected")


def test_deleting_a_target_never_waits_for_the_operator(env: Env) -> None:
    """With the operator down (uninstalled, crash-looping), ``kubectl delete`` returns at
    once: no finalizer. With it running, the deleted target leaves the feedback loop
    instead of being ticked on as an object that is gone."""
    ready_example(env, "orphan")
    ticked = f"feedback {env.namespace}/orphan: ticked"
    log = env.operator.log_path
    wait_until(lambda: ticked in log.read_text(), TIMEOUT, "a feedback tick of orphan")
    env.cluster.kubectl("delete", "st", "orphan", "-n", env.namespace, "--wait=true",
                        "--timeout=20s")  # fmt: skip
    ticks = log.read_text().count(ticked)
    time.sleep(2 * LoopSettings().interval_s)  # two more ticks of the loop
    assert log.read_text().count(ticked) == ticks
    ready_example(env, "stopped")
    env.operator.stop()
    try:
        env.cluster.kubectl("delete", "st", "stopped", "-n", env.namespace, "--wait=true",
                            "--timeout=20s")  # fmt: skip
    finally:
        env.operator.start()


def test_a_spec_at_its_size_bounds_deploys_and_deletes(env: Env) -> None:
    """64 env values of 1,024 accented characters (the CRD's bounds): kopf's record of the
    handled spec, a JSON copy with every character escaped, would exceed the 256 KiB
    annotation limit, and the target would loop forever and never delete."""
    doc = load(ROOT / "examples" / "simulated-chat.yaml", name="bulky")
    doc["spec"]["engine"] = {"env": [{"name": f"V{i}", "value": "é" * 1024} for i in range(64)]}
    ensure_gpu_nodes(env, expected_plan(doc, env.catalog))
    env.apply(doc)
    env.wait_condition("bulky", "Deployed", "True")
    deployment = env.deployment("bulky")
    assert deployment is not None
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "V63", "value": "é" * 1024} in container["env"]
    env.cluster.kubectl("delete", "st", "bulky", "-n", env.namespace, "--wait=true",
                        "--timeout=30s")  # fmt: skip


POD_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor",
                  "listKind": "PodMonitorList"},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object",
                                           "x-kubernetes-preserve-unknown-fields": True}},
        }],
    },
}  # fmt: skip


def test_pod_monitor_when_the_prometheus_operator_is_installed(env: Env) -> None:
    """With the PodMonitor API served, scraping moves from pod annotations to a
    PodMonitor (a stand-in CRD: only its API matters here). Removed afterwards so later
    tests see a cluster without the Prometheus Operator again."""
    existing = env.cluster.kubectl("get", "crd", POD_MONITOR_CRD["metadata"]["name"],
                                   check=False)  # fmt: skip
    if existing.returncode == 0:
        pytest.skip("a real PodMonitor CRD is installed; not replacing it")
    crd_file = env.operator.log_path.parent / "podmonitor-crd.yaml"
    crd_file.write_text(yaml.safe_dump(POD_MONITOR_CRD))
    env.cluster.kubectl("apply", "-f", str(crd_file))
    try:
        env.cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                            "crd/podmonitors.monitoring.coreos.com")  # fmt: skip
        time.sleep(DISCOVERY_TTL_S)  # the operator's last "no PodMonitor kind" expires
        doc = load(ROOT / "examples" / "simulated-chat.yaml", name="monitored")
        ensure_gpu_nodes(env, expected_plan(doc, env.catalog))
        env.apply(doc)
        env.wait_condition("monitored", "Ready", "True")
        monitor: Obj = client.CustomObjectsApi(env.api).get_namespaced_custom_object(
            "monitoring.coreos.com", "v1", env.namespace, "podmonitors", "monitored-engine"
        )
        labels = {
            r["targetLabel"] for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
        }
        assert labels == {"namespace", "servingtarget", "pool"}
        assert monitor["metadata"]["ownerReferences"][0]["name"] == "monitored"
        deployment = env.deployment("monitored")
        assert deployment is not None
        assert "prometheus.io/scrape" not in (
            deployment["spec"]["template"]["metadata"].get("annotations") or {}
        )
    finally:
        env.cluster.kubectl("delete", "crd", POD_MONITOR_CRD["metadata"]["name"], check=False)


@contextlib.contextmanager
def second_install(env: Env, tmp_path: Path, *sets: str) -> Iterator[Env]:
    """Another release of the chart in a fresh namespace, with its own operator process
    (not started) under that release's ServiceAccount; removed afterwards."""
    suffix = uuid.uuid4().hex[:6]
    watched, release = f"team-{suffix}", f"rel-{suffix}"
    env.cluster.create_namespace(watched)
    values = [a for s in ("dashboards.enabled=false", "metrics.enabled=false", *sets)
              for a in ("--set", s)]  # fmt: skip
    env.cluster.helm("install", release, str(CHART), "--namespace", watched, *values)
    operator = Operator(
        env.cluster.serviceaccount_kubeconfig(watched, f"{release}-rooftop"),
        watched,
        tmp_path / "operator.log",
    )
    try:
        # nodes it adds join the module's list, which the env fixture deletes
        yield Env(env.cluster, env.api, watched, operator, env.catalog, env.nodes, release)
    finally:
        operator.stop()
        env.cluster.helm("uninstall", release, "--namespace", watched, check=False)
        env.cluster.kubectl("delete", "namespace", watched, "--wait=false", check=False)


def test_namespace_scoped_install_needs_no_cluster_permissions(env: Env, tmp_path: Path) -> None:
    """rbac.scope=namespace: a Role in the watched namespace only. kopf must run without
    cluster-wide list/watch (no namespace or CRD scanning)."""
    with second_install(env, tmp_path, "rbac.scope=namespace") as scoped:
        can_list_namespaces = subprocess.run(
            [str(find_binary("kubectl", env.cluster.bin_dir)),
             f"--kubeconfig={scoped.operator.kubeconfig}", "auth", "can-i", "list",
             "namespaces"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert can_list_namespaces.stdout.strip() == "no"
        scoped.operator.start()
        ready_example(scoped, "scoped")


def test_upgrade_and_uninstall_keep_targets_and_their_engines(env: Env, tmp_path: Path) -> None:
    """docs/operating.md's upgrade (CRD re-applied server-side, then `helm upgrade`, then the
    operator restarts) leaves a running target's engine Deployment untouched: resuming,
    the operator applies what is already there. `helm uninstall` then removes the
    operator's objects but neither the CRD (Helm keeps `crds/`) nor the user's
    ServingTarget and its engine."""
    with second_install(env, tmp_path) as inst:
        inst.operator.start()
        before = ready_example(inst, "kept")
        target_uid = inst.target("kept")["metadata"]["uid"]
        inst.operator.stop()
        env.cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds")
        )
        env.cluster.helm("upgrade", inst.release, str(CHART), "--namespace", inst.namespace,
                         "--reuse-values", "--set", "operator.verbose=true")  # fmt: skip
        inst.operator.start()
        resumed = f"[{inst.namespace}/kept] Handler 'reconcile_target' succeeded"
        wait_until(lambda: resumed in inst.operator.log_since_start(), TIMEOUT,
                   f"resume of kept\n{inst.operator.tail()}")  # fmt: skip
        after = inst.deployment("kept")
        assert after is not None and inst.condition("kept", "Ready")["status"] == "True"
        for field_ in ("uid", "generation"):
            assert after["metadata"][field_] == before["metadata"][field_]
        inst.operator.stop()
        env.cluster.helm("uninstall", inst.release, "--namespace", inst.namespace)
        crds = env.cluster.kubectl("get", "crd", "servingtargets.rooftop.dev", "-o", "name")
        assert "servingtargets.rooftop.dev" in crds.stdout
        assert inst.target("kept")["metadata"]["uid"] == target_uid
        kept = inst.deployment("kept")
        assert kept is not None and kept["metadata"]["uid"] == before["metadata"]["uid"]


def tenant_pod(name: str, node: str, gpus: int) -> Obj:
    """A pod Rooftop does not own, bound to ``node`` and holding ``gpus`` GPUs."""
    limits = {"nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "job", "image": "job",
                     "resources": {"limits": limits, "requests": limits}}]}}  # fmt: skip


def test_gpu_inventory_plans_for_the_nodes_there_are(env: Env, tmp_path: Path) -> None:
    """operator.gpuInventory=nodes: with only a 1-GPU A10G node, a target that needs a
    multi-GPU A10G pod is infeasible and says which node would do (a big enough node
    with a taint the pods do not tolerate does not count). Such a node joins with one
    GPU held by another team's pod (read through the API server's pod list, with the
    chart's RBAC): still no room, and the condition says how many GPUs are missing.
    Once that pod is gone, the operator's periodic re-plan deploys onto the node
    without a spec edit."""
    core = client.CoreV1Api(env.api)
    doc = load(ROOT / "examples" / "simulated-chat.yaml", name="fits")
    doc["spec"]["mode"] = "vllm"  # a simulated engine needs no GPU node (kwok runs neither)
    doc["spec"]["constraints"]["gpuTypes"] = ["a10g"]
    doc["spec"]["slo"]["tpotMs"] = 20  # one A10G per pod cannot meet this; TP > 1 can
    # one replica's traffic, so the one big node that joins below holds the whole plan
    doc["spec"]["workload"]["requestsPerSecond"] = 1
    expected = expected_plan(doc, env.catalog)
    tp = expected.tp
    assert tp > 1 and expected.replicas == 1
    # CPU and memory for a vLLM pod of several GPUs (2 CPUs and 16 GiB per GPU)
    a10g = GpuType(f"e2e-a10g-{uuid.uuid4().hex[:4]}", "NVIDIA-A10G", 1, 23028, "ampere",
                   (8, 6), "g5.12xlarge", "48", "192Gi")  # fmt: skip

    def add_node(gpus: int, index: int, taint: str | None = None) -> str:
        node = gpu_node(dataclasses.replace(a10g, gpus=gpus), index)
        if taint:
            node.setdefault("spec", {})["taints"] = [{"key": taint, "effect": "NoSchedule"}]
        core.create_node(node)
        env.nodes.append(node["metadata"]["name"])
        return str(node["metadata"]["name"])

    add_node(1, 1)
    add_node(tp, 3, taint="e2e/reserved")
    with second_install(env, tmp_path, "operator.gpuInventory=nodes") as inv:
        inv.operator.start(ROOFTOP_GPU_INVENTORY="nodes", ROOFTOP_NODES_RETRY_S="2")
        inv.apply(doc)
        feasible = inv.wait_condition("fits", "Feasible", "False")
        assert feasible["reason"] == "NodesUnavailable"
        assert f"with nodes of {tp} a10g GPU(s) each, this would work" in feasible["message"]
        assert "taint e2e/reserved:NoSchedule not tolerated" in feasible["message"]
        time.sleep(3 * 2)  # a few replan ticks (2 s) while no node fits
        assert inv.deployment("fits") is None
        big = f"{a10g.prefix}-2"
        core.create_namespaced_pod(inv.namespace, tenant_pod("training", big, gpus=1))
        # A re-plan lists pods, then nodes, a few hundred ms apart: one that listed the
        # pods just before this one existed and the nodes just after the node joined
        # would see the node free and deploy there. Two re-plan periods (2 s) later,
        # every re-plan lists the pod.
        time.sleep(2 * 2)
        add_node(tp, 2)
        missing = f"room for 0: {tp} more a10g GPUs needed"
        wait_until(lambda: missing in inv.condition("fits", "Feasible").get("message", ""),
                   TIMEOUT, f"the shortfall on {big}\n{inv.operator.tail()}")  # fmt: skip
        assert inv.deployment("fits") is None
        core.delete_namespaced_pod("training", inv.namespace, grace_period_seconds=0)
        inv.wait_condition("fits", "Ready", "True")
        plan = inv.target("fits")["status"]["plan"]
        assert (plan["gpu"], plan["tp"]) == ("a10g", tp)
        pods = inv.listed("Pod", ENGINE)
        assert pods and {p["spec"]["nodeName"] for p in pods} == {big}
        # the wait was a condition and a Warning event, not a handler failing and being
        # retried (kopf logs each retry as an ERROR line)
        reasons = {e.reason for e in client.CoreV1Api(env.api).list_namespaced_event(
            inv.namespace, field_selector="involvedObject.name=fits").items}  # fmt: skip
        assert "NodesUnavailable" in reasons
        errors = [ln for ln in inv.operator.log_since_start().splitlines() if "[ERROR" in ln]
        assert not errors, "\n".join(errors)
