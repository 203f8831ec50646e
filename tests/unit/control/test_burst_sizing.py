"""The loop sizes for bursts through the real planner: at the rate the burstiness was
read at, not one window's, and scaled by the latency trim as the window's rate is."""

from __future__ import annotations

from rooftop_api.spec import ServingTargetSpec
from rooftop_control import traffic
from rooftop_control.sizing import PlanTargetPlanner
from rooftop_control.traffic import Bursts
from rooftop_planner.search import plan_target

CODE = ServingTargetSpec.model_validate(
    {
        "model": "llama-3.1-8b",
        "slo": {"tpotMs": 50, "tpotPercentile": "p90", "ttftMs": 2000},
        "workload": {
            "requestsPerSecond": 2.4,
            "promptTokens": {"mean": 2048, "p90": 5188},
            "outputTokens": {"mean": 28, "p90": 55},
        },
        "budget": {"usdPerHour": 100},
        "constraints": {"gpuTypes": ["l4"], "maxReplicas": 24},
    }
)


def _planner() -> PlanTargetPlanner:
    plan = plan_target(CODE).plan
    assert plan is not None
    return PlanTargetPlanner(CODE, plan)


def test_a_lull_keeps_the_capacity_the_bursts_need() -> None:
    """A window with almost no requests sizes one replica for Poisson traffic; with the
    served range's bursts it keeps what their rate needs."""
    planner = _planner()
    declared = traffic.declared(CODE.workload)
    bursty = declared.__class__(
        prompt=declared.prompt, output=declared.output, bursts=Bursts(63.0, 2.4)
    )
    assert planner.size(0.1, 1.0, traffic=declared).replicas == 1
    assert planner.size(0.1, 1.0, traffic=bursty).replicas >= 5


def test_the_trim_raises_the_bursts_capacity_too() -> None:
    planner = _planner()
    declared = traffic.declared(CODE.workload)
    bursty = declared.__class__(
        prompt=declared.prompt, output=declared.output, bursts=Bursts(63.0, 2.4)
    )
    plain = planner.size(0.1, 1.0, traffic=bursty).replicas
    assert planner.size(0.1, 1.0, traffic=bursty.trimmed(1.5)).replicas > plain
