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

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.handle import ClusterHandle
from tests.cluster.loop_world import Load, LoopScenario, World, loop_world, wait

pytestmark = pytest.mark.loop

ROOT = Path(__file__).resolve().parents[2]
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


SCENARIO = LoopScenario(
    prefix="accept",
    release="accept-e2e",
    name=NAME,
    target=target,
    load=Load("llama-3-70b", PROMPT_TOKENS, OUTPUT_TOKENS, RATE, seed=11),
    env=LOOP_ENV,
    nodes=2,
    engine_args=("--acceptance-rate", str(TRUE_ACCEPTANCE)),
    interval=INTERVAL,
)


@pytest.fixture(scope="module")
def world(
    cluster: ClusterHandle,
    prometheus_operator_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    with loop_world(
        cluster, prometheus_operator_dir, tmp_path_factory.mktemp("accept"), SCENARIO
    ) as w:
        yield w


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
