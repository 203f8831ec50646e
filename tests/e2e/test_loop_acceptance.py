"""The loop plans a speculating target again with the acceptance its drafts meet, end
to end: operator, kwok H100 nodes, engine-sim processes on the pods' IPs, a real
Prometheus on the Prometheus Operator's configuration (the engines' PodMonitor), load.

The target declares a per-token acceptance of 0.7, at which the planner deploys one
4-GPU replica with a draft model; the engines truly accept 0.95 (engine-sim's
``--acceptance-rate``, the simulated world the operator does not know). The loop reads
the spec-decode counters, solves the acceptance, and plans the target again with it:
one 2-GPU replica. The Deployment rolls over, the engines of the new pods serve, and
an operator restart keeps the plan (``status.plan.measuredAcceptance``).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from rooftop_api.spec import TARGET_LABEL
from tests.cluster import prometheus_operator
from tests.cluster.engines import EngineFleet, LoadDriver
from tests.cluster.handle import ClusterHandle
from tests.cluster.nodes import H100, gpu_node
from tests.cluster.operator_process import Operator

pytestmark = pytest.mark.loop

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rooftop"
RELEASE = "accept-e2e"
GROUP, VERSION, PLURAL = "rooftop.dev", "v1alpha1", "servingtargets"
NAME = "fast-70b"
RATE = 2.0  # req/s: at 0.7 one TP4 replica with drafts, at 0.95 one TP2 replica
TRUE_ACCEPTANCE = 0.95
PROMPT_TOKENS, OUTPUT_TOKENS = 1147, 260
INTERVAL = "5s"  # the stack's scrape and rule interval, and the operator's scrape
LOOP_ENV = {
    "ROOFTOP_LOOP_INTERVAL_S": "2",
    "ROOFTOP_LOOP_WINDOW": "60s",  # four scrapes of the engines' PodMonitor
    "ROOFTOP_LOOP_STALE_AFTER_S": "40",
    "ROOFTOP_LOOP_STARTUP_S": "5",
}


def target(mark: dict[str, str]) -> dict[str, Any]:
    """examples/speculative-70b.yaml at ``RATE``, on the nodes labelled ``mark``."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "speculative-70b.yaml").read_text())
    doc["spec"]["workload"]["requestsPerSecond"] = RATE
    doc["spec"]["constraints"].update({"maxReplicas": 2, "nodeSelector": mark})
    return doc


@dataclass
class World:
    api: Any
    namespace: str
    operator: Operator
    fleet: EngineFleet
    operator_args: tuple[str, ...]
    operator_env: dict[str, str]

    def start_operator(self) -> None:
        self.operator.start(*self.operator_args, **self.operator_env)

    def target(self) -> dict[str, Any]:
        found: dict[str, Any] = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, NAME
        )
        return found

    def plan(self) -> dict[str, Any]:
        return dict(self.target().get("status", {}).get("plan") or {})

    def events(self, reason: str) -> list[str]:
        found = client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={NAME},reason={reason}"
        )
        return [str(e.message) for e in found.items]

    def engine_pods_tp(self) -> list[str]:
        """Each Running engine pod's --tp (what engine-sim simulates)."""
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector=f"{TARGET_LABEL}={NAME}"
        )
        found = []
        for pod in pods.items:
            if pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None:
                command = pod.spec.containers[0].command
                found.append(command[command.index("--tp") + 1])
        return found


def wait(world: World, what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(
        f"timed out after {timeout:.0f}s: {what}\nplan: {world.plan()}\n"
        f"observed: {world.target().get('status', {}).get('observed')}\n"
        f"conditions: {world.target().get('status', {}).get('conditions')}\n"
        f"operator log:\n{world.operator.tail(30)}"
    )


@pytest.fixture(scope="module")
def world(
    cluster: ClusterHandle,
    prometheus_operator_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    suffix = uuid.uuid4().hex[:6]
    system, ns = f"accept-system-{suffix}", f"accept-{suffix}"
    work = tmp_path_factory.mktemp("accept")
    (work / "engines").mkdir()
    cluster.create_namespace(system)
    cluster.create_namespace(ns)
    # two 8-GPU H100 nodes of this module's own (a letter first: a bare hex value can
    # read as a number), so other modules' pods take none of their GPUs
    mark = {"e2e-acceptance": f"a{suffix}"}
    core, nodes = client.CoreV1Api(cluster.api()), []
    for i in range(2):
        node = gpu_node(dataclasses.replace(H100, prefix=f"accept-h100-{suffix}"), i)
        node["metadata"]["labels"].update(mark)
        core.create_node(node)
        nodes.append(node["metadata"]["name"])
    api = cluster.api()
    truth = ["--acceptance-rate", str(TRUE_ACCEPTANCE)]  # after the operator's own flag
    fleet = EngineFleet(api, ns, NAME, work / "engines", extra_args=truth)
    load = LoadDriver(fleet, "llama-3-70b", PROMPT_TOKENS, OUTPUT_TOKENS, seed=11, rate=RATE)
    release = prometheus_operator.monitored_release(
        cluster, prometheus_operator_dir, CHART, RELEASE, (system, ns), work, interval=INTERVAL
    )
    try:
        with release as installed:
            world = World(api, ns, installed.operator, fleet, installed.operator_args(),
                          installed.operator_env() | LOOP_ENV)  # fmt: skip
            try:
                world.start_operator()
                fleet.start()
                path = work / "target.yaml"
                path.write_text(json.dumps(target(mark)))
                cluster.kubectl("apply", "-n", ns, "-f", str(path))
                load.start()
                yield world
            finally:
                load.stop(drain_s=5)
                fleet.stop()
    finally:
        cluster.delete_later("namespace", ns, system)
        cluster.delete_later("node", *nodes)
        api.close()


def test_the_declared_acceptance_deploys_four_gpus_with_drafts(world: World) -> None:
    planned = wait(world, "the first plan", lambda: world.plan(), 60)
    assert planned["tp"] == 4 and "measuredAcceptance" not in planned
    assert json.loads(planned["speculativeConfig"])["method"] == "draft_model"
    wait(world, "an engine serving", lambda: world.fleet.endpoints(), 90)


def test_the_measured_acceptance_plans_two_gpus_and_they_serve(world: World) -> None:
    """The loop measures the acceptance the engines meet, plans again with it, and the
    Deployment rolls over to one 2-GPU replica whose engine serves."""
    replanned = wait(world, "a re-plan onto TP2", lambda: world.plan().get("tp") == 2, 300)
    assert replanned
    plan = world.plan()
    assert plan["measuredAcceptance"] == pytest.approx(TRUE_ACCEPTANCE, abs=0.04)
    (why,) = world.events("Replanned")
    assert "drafts are accepted at" in why and "planned again" in why
    assert any("acceptance" in m for m in world.events("PlanChanged"))
    wait(world, "only TP2 engine pods", lambda: set(world.engine_pods_tp()) == {"2"}, 180)
    wait(world, "the TP2 engine serving", lambda: world.fleet.endpoints(), 90)


def test_an_operator_restart_keeps_the_measured_plan(world: World) -> None:
    world.operator.stop()
    world.start_operator()
    wait(world, "the operator resumed", lambda: world.operator.starts >= 2, 30)
    time.sleep(15.0)  # a resume reconciles the unchanged spec within seconds
    plan = world.plan()
    assert plan["tp"] == 2 and plan["measuredAcceptance"] == pytest.approx(0.95, abs=0.04)
    # the loop may have scaled out since (a restarted loop holds until it has a
    # window): every pod runs the measured plan's TP2
    assert set(world.engine_pods_tp()) == {"2"}
