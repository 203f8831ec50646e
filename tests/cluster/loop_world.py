"""One ServingTarget's world in a loop e2e module: the operator installed by the chart
beside the Prometheus Operator's stack, kwok H100 nodes, engine-sim processes on the
target's pods and a load over them (``loop_world``), with what the tests read of it
(``World``)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from rooftop_api.spec import TARGET_LABEL
from tests.cluster import prometheus_operator
from tests.cluster.engines import EngineFleet, LoadDriver
from tests.cluster.handle import ClusterHandle
from tests.cluster.nodes import H100, gpu_node
from tests.cluster.operator_process import Operator

GROUP, VERSION, PLURAL = "rooftop.dev", "v1alpha1", "servingtargets"
CHART = Path(__file__).resolve().parents[2] / "charts" / "rooftop"


@dataclass
class World:
    api: Any
    namespace: str
    name: str
    operator: Operator
    fleet: EngineFleet
    operator_args: tuple[str, ...]
    operator_env: dict[str, str]

    def start_operator(self) -> None:
        self.operator.start(*self.operator_args, **self.operator_env)

    def target(self) -> dict[str, Any]:
        found: dict[str, Any] = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        return found

    def plan(self) -> dict[str, Any]:
        return dict(self.target().get("status", {}).get("plan") or {})

    def events(self, reason: str) -> list[str]:
        found = client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={self.name},reason={reason}"
        )
        return [str(e.message) for e in found.items]

    def engine_pods_tp(self) -> list[str]:
        """Each Running engine pod's --tp (what engine-sim simulates)."""
        pods = client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector=f"{TARGET_LABEL}={self.name}"
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


@dataclass(frozen=True)
class Load:
    """Poisson arrivals of fixed-length requests (``LoadDriver``)."""

    model: str
    prompt_tokens: int
    output_tokens: int
    rate: float
    seed: int = 0


@dataclass(frozen=True)
class LoopScenario:
    """One loop module's target and what drives it.

    Attributes:
        prefix: names its namespaces, nodes and the label its target's pods select.
        release: the chart's release name.
        name: the ServingTarget's name.
        target: its document, with pods on the nodes labelled with the mark it is given.
        load: what the load sends.
        env: the operator's environment beyond the chart's (the loop's settings).
        nodes: how many 8-GPU H100 kwok nodes it has of its own.
        engine_args: engine-sim flags after the operator's own (the simulated world's
            truth, which the operator does not know).
        interval: the stack's scrape and rule interval, and the operator's scrape.
    """

    prefix: str
    release: str
    name: str
    target: Callable[[dict[str, str]], dict[str, Any]]
    load: Load
    env: dict[str, str]
    nodes: int = 1
    engine_args: tuple[str, ...] = ()
    interval: str = "5s"


@contextmanager
def loop_world(
    cluster: ClusterHandle, built: Path, work: Path, scenario: LoopScenario
) -> Iterator[World]:
    """``scenario`` running: its namespaces and nodes, the chart's operator with the
    Prometheus Operator's stack (``built``: its binaries), engine-sim on the target's
    pods, and the load over them; all of it gone on the way out."""
    suffix = uuid.uuid4().hex[:6]
    system, ns = f"{scenario.prefix}-system-{suffix}", f"{scenario.prefix}-{suffix}"
    (work / "engines").mkdir()
    cluster.create_namespace(system)
    cluster.create_namespace(ns)
    # nodes of the scenario's own (a letter first: a bare hex value can read as a
    # number), so other modules' pods take none of their GPUs
    mark = {f"e2e-{scenario.prefix}": f"a{suffix}"}
    api = cluster.api()
    nodes = [_node(api, f"{scenario.prefix}-h100-{suffix}", i, mark) for i in range(scenario.nodes)]
    fleet = EngineFleet(api, ns, scenario.name, work / "engines", extra_args=scenario.engine_args)
    sent = scenario.load
    load = LoadDriver(
        fleet, sent.model, sent.prompt_tokens, sent.output_tokens, sent.seed, sent.rate
    )
    release = prometheus_operator.monitored_release(
        cluster, built, CHART, scenario.release, (system, ns), work, interval=scenario.interval
    )
    try:
        with release as installed:
            env = installed.operator_env() | scenario.env
            world = World(api, ns, scenario.name, installed.operator, fleet,
                          installed.operator_args(), env)  # fmt: skip
            try:
                world.start_operator()
                fleet.start()
                path = work / "target.yaml"
                path.write_text(json.dumps(scenario.target(mark)))
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


def _node(api: Any, prefix: str, index: int, mark: dict[str, str]) -> str:
    """An 8-GPU H100 kwok node labelled ``mark``; its name."""
    node = gpu_node(dataclasses.replace(H100, prefix=prefix), index)
    node["metadata"]["labels"].update(mark)
    client.CoreV1Api(api).create_node(node)
    return str(node["metadata"]["name"])
