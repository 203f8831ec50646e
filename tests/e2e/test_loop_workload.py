"""The loop plans a target again with the lengths it serves, end to end: operator, a
kwok H100 node, engine-sim processes on the pods' IPs, a real Prometheus on the
Prometheus Operator's configuration (the engines' PodMonitor), load.

The target declares 24,000-token prompts at 2 req/s, for which the planner deploys one
4-GPU replica. The load sends 1,147-token prompts. The loop reads the served lengths
from vLLM's request histograms, and once its readings were OK for a scale-down window
plans the whole target again with them: one 1-GPU replica, a quarter of the price, so
the Deployment rolls over to it. ``status.plan.measuredWorkload`` keeps the lengths,
and an operator restart plans with them again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.handle import ClusterHandle
from tests.cluster.loop_world import GROUP, VERSION, Load, LoopScenario, World, loop_world, wait

pytestmark = pytest.mark.loop

NAME = "long-declared"
RATE = 2.0  # req/s: 24k-token prompts need TP4 at it, 1k-token ones TP1
PROMPT_TOKENS, OUTPUT_TOKENS = 1147, 260
INTERVAL = "5s"  # the stack's scrape and rule interval, and the operator's scrape
LOOP_ENV = {
    "ROOFTOP_LOOP_INTERVAL_S": "2",
    "ROOFTOP_LOOP_WINDOW": "60s",  # four scrapes of the engines' PodMonitor
    "ROOFTOP_LOOP_STALE_AFTER_S": "40",
    "ROOFTOP_LOOP_STARTUP_S": "5",
    "ROOFTOP_LOOP_SCALE_DOWN_WINDOW_S": "60",  # what a re-plan waits for, as a scale-down
}


def target(mark: dict[str, str]) -> dict[str, Any]:
    """An 8B chat target declared with 24k-token prompts, on the nodes labelled ``mark``."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServingTarget",
        "metadata": {"name": NAME},
        "spec": {
            "model": "llama-3.1-8b",
            "mode": "simulated",
            "slo": {"tpotMs": 50, "tpotPercentile": "p90", "ttftMs": 3000, "ttftPercentile": "p90"},
            "workload": {
                "requestsPerSecond": RATE,
                "promptTokens": {"mean": 24000, "p90": 32000},
                "outputTokens": {"mean": OUTPUT_TOKENS, "p90": 432},
            },
            "budget": {"usdPerHour": 40},
            "constraints": {"gpuTypes": ["h100-sxm"], "maxReplicas": 2, "nodeSelector": mark},
        },
    }


SCENARIO = LoopScenario(
    prefix="lengths",
    release="lengths-e2e",
    name=NAME,
    target=target,
    load=Load("llama-3.1-8b", PROMPT_TOKENS, OUTPUT_TOKENS, RATE, seed=5),
    env=LOOP_ENV,
    interval=INTERVAL,
)


@pytest.fixture(scope="module")
def world(
    cluster: ClusterHandle,
    prometheus_operator_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    with loop_world(
        cluster, prometheus_operator_dir, tmp_path_factory.mktemp("lengths"), SCENARIO
    ) as w:
        yield w


def test_the_declared_lengths_deploy_four_gpus(world: World) -> None:
    planned = wait(world, "the first plan", lambda: world.plan(), 60)
    assert (planned["tp"], planned["replicas"]) == (4, 1)
    assert "measuredWorkload" not in planned
    wait(world, "an engine serving", lambda: world.fleet.endpoints(), 90)


def test_the_served_lengths_plan_one_gpu_and_it_serves(world: World) -> None:
    """The loop reads 1,147-token prompts, plans again with them, and the Deployment
    rolls over to one 1-GPU replica whose engine serves."""
    wait(world, "a re-plan onto TP1", lambda: world.plan().get("tp") == 1, 420)
    plan = world.plan()
    served = plan["measuredWorkload"]["promptTokens"]
    assert served["mean"] == pytest.approx(PROMPT_TOKENS, rel=0.02)
    (why,) = world.events("Replanned")
    assert "the served prompts (1,147 tokens on average" in why
    assert any("(workload)" in m for m in world.events("PlanChanged"))
    assert not world.events("PlanKept")
    wait(world, "only TP1 engine pods", lambda: set(world.engine_pods_tp()) == {"1"}, 180)
    wait(world, "the TP1 engine serving", lambda: world.fleet.endpoints(), 90)


def test_an_operator_restart_keeps_the_served_lengths_plan(world: World) -> None:
    world.operator.stop()
    world.start_operator()
    wait(world, "the operator resumed", lambda: world.operator.starts >= 2, 30)
    time.sleep(15.0)  # a resume reconciles the unchanged spec within seconds
    plan = world.plan()
    assert plan["tp"] == 1 and "measuredWorkload" in plan
    assert set(world.engine_pods_tp()) == {"1"}
    assert not world.events("Replanned")[1:], "the loop does not ask again"
